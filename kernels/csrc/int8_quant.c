/* The int8 kernels' data: activations quantized to int8 blocks of 32, Int8Matrix objects
 * read into an I8Mat, and rows of the tiled layout back to float32 (embedding lookups).
 * The layout and the arithmetic are described in int8.h; kernels/int8_ref.py defines them
 * in NumPy. */
#include "int8.h"

#include <math.h>

/* The block's d and xq: d = max|x| / 127, xq = round-half-even(x * (1 / d)). The product
 * stays within 127 * (1 + 2^-22) of 127, so no clamp is needed; nearbyintf rounds half to
 * even in the default rounding mode, as vcvtps2dq does. */
static float quantize_block(const float *x, int8_t *xq) {
    float amax = 0.0f;
    for (int i = 0; i < I8_BLOCK; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < I8_BLOCK; i++) xq[i] = (int8_t)nearbyintf(x[i] * id);
    return d;
}

void i8_quantize_row(const float *x, Py_ssize_t k, int group_size, const I8Row *r) {
    for (Py_ssize_t b = 0; b < k / I8_BLOCK; b++)
        r->d[b] = quantize_block(x + b * I8_BLOCK, r->xq + b * I8_BLOCK);
    /* xb[g] = sum over the 32-blocks the group overlaps of d_b * (sum of xq there) */
    for (Py_ssize_t g = 0; g < k / group_size; g++) {
        float xb = 0.0f;
        for (Py_ssize_t e = g * group_size; e < (g + 1) * group_size;) {
            const Py_ssize_t b = e / I8_BLOCK, end = (b + 1) * I8_BLOCK;
            const Py_ssize_t stop = end < (g + 1) * group_size ? end : (g + 1) * group_size;
            int32_t xsum = 0;
            for (; e < stop; e++) xsum += r->xq[e];
            xb = fmaf(r->d[b], (float)xsum, xb);
        }
        r->xb[g] = xb;
    }
}

/* -- Int8Matrix -> I8Mat ---------------------------------------------------------------- */

static int get_long(PyObject *obj, const char *name, long *value) {
    PyObject *a = PyObject_GetAttrString(obj, name);
    if (!a) return -1;
    *value = PyLong_AsLong(a);
    Py_DECREF(a);
    return *value == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Attribute `name` as a C-contiguous buffer of `itemsize`-byte items and `count` of them. */
static const void *get_array(PyObject *obj, const char *name, Py_ssize_t itemsize,
                             Py_ssize_t count, Py_buffer *views, int *nviews) {
    PyObject *a = PyObject_GetAttrString(obj, name);
    if (!a) return NULL;
    Py_buffer *view = &views[*nviews];
    const int status = PyObject_GetBuffer(a, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT);
    Py_DECREF(a);
    if (status < 0) return NULL;
    (*nviews)++;
    if (view->itemsize != itemsize || view->len != count * itemsize) {
        PyErr_Format(PyExc_ValueError,
                     "Int8Matrix.%s must hold %zd C-contiguous items of %zd bytes, not %zd of %zd",
                     name, count, itemsize, view->len / (view->itemsize ? view->itemsize : 1),
                     view->itemsize);
        return NULL;
    }
    return view->buf;
}

int i8mat_from_object(PyObject *obj, I8Mat *w, Py_buffer *views, int *nviews) {
    long n, k, bits, group_size, half;
    *nviews = 0;
    if (get_long(obj, "n", &n) < 0 || get_long(obj, "k", &k) < 0 ||
        get_long(obj, "bits", &bits) < 0 || get_long(obj, "group_size", &group_size) < 0 ||
        get_long(obj, "half", &half) < 0)
        return -1;
    if (bits < 2 || bits > 8 || bits == 7) {
        PyErr_Format(PyExc_ValueError, "Int8Matrix bits must be 2, 3, 4, 5, 6 or 8, not %ld",
                     bits);
        return -1;
    }
    if (n < 0 || k <= 0 || k % I8_BLOCK ||
        !(group_size == 16 || (group_size > 0 && group_size % I8_BLOCK == 0)) ||
        k % group_size) {
        PyErr_Format(PyExc_ValueError,
                     "Int8Matrix: group_size %ld must be 16 or a multiple of 32 dividing k=%ld "
                     "(a multiple of 32)", group_size, k);
        return -1;
    }
    w->n = n;
    w->k = k;
    w->bits = (int)bits;
    w->group_size = (int)group_size;
    w->half = half != 0;
    const Py_ssize_t tiles = i8_tiles(w), groups = k / group_size;
    const Py_ssize_t pitem = w->half ? 2 : 4;
    w->qs = get_array(obj, "qs", 1, tiles * i8_tile_qs_bytes(w), views, nviews);
    if (!w->qs) return -1;
    w->hbits = NULL;
    if (i8_planes(w)) {
        w->hbits = get_array(obj, "hbits", 8, tiles * i8_planes(w) * (k / 4), views, nviews);
        if (!w->hbits) return -1;
    }
    w->scales = get_array(obj, "scales", pitem, tiles * groups * I8_TILE, views, nviews);
    if (!w->scales) return -1;
    w->biases = get_array(obj, "biases", pitem, tiles * groups * I8_TILE, views, nviews);
    return w->biases ? 0 : -1;
}

/* -- back to float32 -------------------------------------------------------------------- */

static inline float param(const I8Mat *w, const void *a, Py_ssize_t i) {
    return w->half ? half_to_float(((const uint16_t *)a)[i]) : ((const float *)a)[i];
}

static void dequant_row(const I8Mat *w, Py_ssize_t j, float *dst) {
    const Py_ssize_t groups = w->k / w->group_size;
    const Py_ssize_t base = (j / I8_TILE) * groups * I8_TILE + j % I8_TILE;
    for (Py_ssize_t g = 0; g < groups; g++) {
        const float s = param(w, w->scales, base + g * I8_TILE);
        const float b = param(w, w->biases, base + g * I8_TILE);
        for (Py_ssize_t e = g * w->group_size; e < (g + 1) * w->group_size; e++)
            dst[e] = fmaf(s, (float)i8_q(w, j, e), b);
    }
}

typedef struct {
    const I8Mat *w;
    const int64_t *rows;
    Py_ssize_t count, per_chunk;
    float *out;
} DequantJob;

static void dequant_chunk(const void *ctx, Py_ssize_t chunk) {
    const DequantJob *job = ctx;
    const Py_ssize_t i0 = chunk * job->per_chunk;
    const Py_ssize_t i1 = i0 + job->per_chunk < job->count ? i0 + job->per_chunk : job->count;
    for (Py_ssize_t i = i0; i < i1; i++)
        dequant_row(job->w, job->rows ? job->rows[i] : i, job->out + i * job->w->k);
}

void i8_dequantize(const I8Mat *w, const int64_t *rows, Py_ssize_t count, float *out) {
    const Py_ssize_t per_chunk = (1 << 16) / w->k + 1;
    const DequantJob job = {w, rows, count, per_chunk, out};
    parallel_for(dequant_chunk, &job, (count + per_chunk - 1) / per_chunk, 0);
}
