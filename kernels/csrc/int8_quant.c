/* The int8 kernels' data: activations quantized to int8 blocks of 32, Int8Matrix objects
 * read into an I8Mat, and rows of the tiled layout back to float32 (embedding lookups).
 * The layout and the arithmetic are described in int8.h; kernels/int8_ref.py defines them
 * in NumPy. */
#include "int8.h"

#include <math.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define I8_X86 1
#else
#define I8_X86 0
#endif

/* One block's d, xq and the int sums of xq's halves: d = max|x| / 127 and
 * xq = round-half-even(x * (1 / d)). The product stays within 127 * (1 + 2^-22) of 127,
 * so no clamp is needed; nearbyintf rounds half to even in the default rounding mode, as
 * vcvtps2dq does, and max is exact, so every path agrees. res: the residual
 * fma(-d, xq, x) (the second level's input), or NULL. */
static float block_generic(const float *x, int8_t *xq, int32_t *sums, float *res) {
    float amax = 0.0f;
    for (int i = 0; i < I8_BLOCK; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    sums[0] = sums[1] = 0;
    for (int i = 0; i < I8_BLOCK; i++) {
        xq[i] = (int8_t)nearbyintf(x[i] * id);
        sums[i / 16] += xq[i];
        if (res) res[i] = fmaf(-d, (float)xq[i], x[i]);
    }
    return d;
}

#if I8_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma")
static float block_avx512(const float *x, int8_t *xq, int32_t *sums, float *res) {
    const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 idv = _mm512_set1_ps(id);
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, idv));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, idv));
    _mm_storeu_si128((__m128i *)xq, _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128((__m128i *)(xq + 16), _mm512_cvtsepi32_epi8(qhi));
    sums[0] = _mm512_reduce_add_epi32(qlo);
    sums[1] = _mm512_reduce_add_epi32(qhi);
    if (res) {
        const __m512 dv = _mm512_set1_ps(d);
        _mm512_storeu_ps(res, _mm512_fnmadd_ps(dv, _mm512_cvtepi32_ps(qlo), lo));
        _mm512_storeu_ps(res + 16, _mm512_fnmadd_ps(dv, _mm512_cvtepi32_ps(qhi), hi));
    }
    return d;
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
static inline int32_t hsum256(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

static float block_avx2(const float *x, int8_t *xq, int32_t *sums, float *res) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    __m256i q[4];
    for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
    /* int32 -> int8 in order: the packs interleave 128-bit lanes, the permute undoes it */
    const __m256i q8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)xq,
                        _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    sums[0] = hsum256(_mm256_add_epi32(q[0], q[1]));
    sums[1] = hsum256(_mm256_add_epi32(q[2], q[3]));
    if (res)
        for (int i = 0; i < 4; i++)
            _mm256_storeu_ps(res + 8 * i,
                             _mm256_fnmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(q[i]), v[i]));
    return d;
}
#pragma GCC pop_options
#endif /* I8_X86 */

typedef float (*BlockFn)(const float *x, int8_t *xq, int32_t *sums, float *res);

/* xb[g] for each group: fma(d_b, sum of xq over its overlap with block b, .) in order,
 * then the same for the second level's (d2, hsum2) when there is one. */
static void bias_sums(const I8Row *r, Py_ssize_t k, int group_size) {
    for (Py_ssize_t g = 0; g < k / group_size; g++) {
        float xb = 0.0f;
        for (Py_ssize_t e = g * group_size; e < (g + 1) * group_size;) {
            const Py_ssize_t b = e / I8_BLOCK, end = (b + 1) * I8_BLOCK;
            const Py_ssize_t stop = end < (g + 1) * group_size ? end : (g + 1) * group_size;
            int32_t xsum = 0, xsum2 = 0;
            for (; e < stop; e += 16) {
                xsum += r->hsum[e / 16];
                if (r->xq2) xsum2 += r->hsum2[e / 16];
            }
            xb = fmaf(r->d[b], (float)xsum, xb);
            if (r->xq2) xb = fmaf(r->d2[b], (float)xsum2, xb);
        }
        r->xb[g] = xb;
    }
}

void i8_quantize_row(const float *x, Py_ssize_t k, int group_size, const I8Row *r) {
    BlockFn block = block_generic;
#if I8_X86
    const int path = i8_current_path();
    if (path == I8_AVX512VNNI)
        block = block_avx512;
    else if (path != I8_GENERIC)
        block = block_avx2;
#endif
    float res[I8_BLOCK];
    for (Py_ssize_t b = 0; b < k / I8_BLOCK; b++) {
        const Py_ssize_t at = b * I8_BLOCK;
        r->d[b] = block(x + at, r->xq + at, r->hsum + 2 * b, r->xq2 ? res : NULL);
        if (r->xq2) r->d2[b] = block(res, r->xq2 + at, r->hsum2 + 2 * b, NULL);
    }
    bias_sums(r, k, group_size);
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
    long n, k, bits, group_size, half, zero;
    *nviews = 0;
    if (get_long(obj, "n", &n) < 0 || get_long(obj, "k", &k) < 0 ||
        get_long(obj, "bits", &bits) < 0 || get_long(obj, "group_size", &group_size) < 0 ||
        get_long(obj, "half", &half) < 0 || get_long(obj, "zero", &zero) < 0)
        return -1;
    if (zero < 0 || zero >= 256) {
        PyErr_Format(PyExc_ValueError, "Int8Matrix zero must be in [0, 256), not %ld", zero);
        return -1;
    }
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
    w->zero = (int)zero;
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
    w->biases = NULL;
    if (w->zero) return 0;
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
        const float b = w->zero ? s * (float)-w->zero : param(w, w->biases, base + g * I8_TILE);
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
