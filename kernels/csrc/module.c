/* The Python module kernels._qmatmul: each entry point checks its arguments (dtype,
 * layout, shapes), releases the GIL and calls into matmul.c, attention.c or pool.c. */
#include "qmatmul.h"

#include <stdlib.h>
#include <string.h>

static const char *const ISA_NAMES[] = {"generic", "avx2", "avx512"};

/* Views of the arguments, released together. */
typedef struct {
    Py_buffer views[8];
    int count;
} Views;

static void release_views(Views *v) {
    for (int i = 0; i < v->count; i++) PyBuffer_Release(&v->views[i]);
    v->count = 0;
}

/* A C-contiguous buffer of `ndim` dimensions whose items are of `kind`: 'f' float32,
 * 'p' float32 or float16 (quantization parameters), 'u' uint32, 'i' int64. */
static Py_buffer *get_view(Views *v, PyObject *obj, const char *name, char kind, int ndim,
                           int writable) {
    Py_buffer *view = &v->views[v->count];
    const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return NULL;
    v->count++;
    const char *format = view->format ? view->format : "B";
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') format++;
    const char *accepted = kind == 'f' ? "f" : kind == 'p' ? "fe" : kind == 'u' ? "IL" : "lq";
    const Py_ssize_t itemsize = kind == 'i' ? 8 : kind == 'p' && format[0] == 'e' ? 2 : 4;
    if (view->itemsize != itemsize || strlen(format) != 1 || !strchr(accepted, format[0]) ||
        view->ndim != ndim) {
        const char *what = kind == 'f'   ? "float32"
                           : kind == 'p' ? "float32 or float16"
                           : kind == 'u' ? "uint32"
                                         : "int64";
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous %d-D %s array", name, ndim,
                     what);
        return NULL;
    }
    return view;
}

/* packed, scales, biases, group_size, bits -> QMat with n rows; k from the caller. */
static int get_qmat(Views *v, PyObject *const *args, Py_ssize_t n, Py_ssize_t k, QMat *w) {
    const long group_size = PyLong_AsLong(args[3]), bits = PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return -1;
    if (bits < 2 || bits > 8 || bits == 7) {
        PyErr_Format(PyExc_ValueError, "bits must be 2, 3, 4, 5, 6 or 8, not %ld", bits);
        return -1;
    }
    if (!(group_size == 16 || (group_size > 0 && group_size % CHUNK == 0)) || k % group_size ||
        k % CHUNK) {
        PyErr_Format(PyExc_ValueError,
                     "group_size must be 16 or a positive multiple of 32 dividing k=%zd (a "
                     "multiple of 32), not %ld",
                     k, group_size);
        return -1;
    }
    Py_buffer *packed = get_view(v, args[0], "packed", 'u', 2, 0);
    if (!packed) return -1;
    Py_buffer *scales = get_view(v, args[1], "scales", 'p', 2, 0);
    if (!scales) return -1;
    Py_buffer *biases = get_view(v, args[2], "biases", 'p', 2, 0);
    if (!biases) return -1;
    if (scales->itemsize != biases->itemsize) {
        PyErr_SetString(PyExc_ValueError, "scales and biases must have one dtype");
        return -1;
    }
    const Py_ssize_t groups = k / group_size;
    if (packed->shape[0] != n || packed->shape[1] * 32 != k * bits || scales->shape[0] != n ||
        scales->shape[1] != groups || biases->shape[0] != n || biases->shape[1] != groups) {
        PyErr_Format(PyExc_ValueError,
                     "quantized shapes do not match [n=%zd, k=%zd] at %ld bits, group %ld", n, k,
                     bits, group_size);
        return -1;
    }
    w->packed = (const uint8_t *)packed->buf;
    w->scales = scales->buf;
    w->biases = biases->buf;
    w->half = scales->itemsize == 2;
    w->n = n;
    w->k = k;
    w->group_size = (int)group_size;
    w->bits = (int)bits;
    return 0;
}

PyDoc_STRVAR(matmul_doc,
             "matmul(x, packed, scales, biases, group_size, bits, out)\n\n"
             "out[m, n] = x[m, k] @ dequantize(W)^T; x and out float32, packed uint32\n"
             "[n, k * bits / 32], scales and biases float32 or float16, all C-contiguous.");

static PyObject *py_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "matmul takes 7 arguments");
        return NULL;
    }
    Views v = {.count = 0};
    QMat w;
    Py_buffer *x = get_view(&v, args[0], "x", 'f', 2, 0);
    Py_buffer *out = x ? get_view(&v, args[6], "out", 'f', 2, 1) : NULL;
    if (!out) goto fail;
    const Py_ssize_t m = x->shape[0], k = x->shape[1], n = out->shape[1];
    if (out->shape[0] != m) {
        PyErr_SetString(PyExc_ValueError, "out must have as many rows as x");
        goto fail;
    }
    if (get_qmat(&v, args + 1, n, k, &w) < 0) goto fail;
    float *scratch = NULL;
    if (m > 0 && !(scratch = alloc_aligned((size_t)(m * k) * sizeof(float)))) {
        PyErr_NoMemory();
        goto fail;
    }
    if (m > 0 && n > 0) {
        Py_BEGIN_ALLOW_THREADS;
        run_matmul(&w, (const float *)x->buf, (float *)out->buf, m, scratch);
        Py_END_ALLOW_THREADS;
    }
    free_aligned(scratch);
    release_views(&v);
    Py_RETURN_NONE;
fail:
    release_views(&v);
    return NULL;
}

/* A float32 or float16 3-D view whose last axis is contiguous (the KV cache's [:, :S]
 * slices of its [heads, capacity, dim] buffers). */
static Py_buffer *get_rows_view(Views *v, PyObject *obj, const char *name) {
    Py_buffer *view = &v->views[v->count];
    if (PyObject_GetBuffer(obj, view, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return NULL;
    v->count++;
    const char *format = view->format ? view->format : "B";
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') format++;
    const Py_ssize_t size = view->itemsize;
    const int is_f32 = size == 4 && strcmp(format, "f") == 0;
    const int is_f16 = size == 2 && strcmp(format, "e") == 0;
    if (!(is_f32 || is_f16) || view->ndim != 3 || view->strides[2] != size ||
        view->strides[0] % size || view->strides[1] % size || view->strides[0] < 0 ||
        view->strides[1] < 0) {
        PyErr_Format(PyExc_ValueError, "%s must be a float32 or float16 [heads, rows, dim] "
                                       "array whose last axis is contiguous", name);
        return NULL;
    }
    return view;
}

PyDoc_STRVAR(attention_doc,
             "attention(q, k, v, scale, mask, out)\n\n"
             "out[h, l] = softmax(scale * q[h, l] k[h // G]^T) v[h // G] with G = Hq / Hkv;\n"
             "q, out float32 C-contiguous [Hq, L, D]; k, v both float32 or both float16\n"
             "[Hkv, S, D] with a contiguous last axis; mask None or bool C-contiguous [L, S]\n"
             "(True: visible).");

static PyObject *py_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "attention takes 6 arguments");
        return NULL;
    }
    Views v = {.count = 0};
    const double scale = PyFloat_AsDouble(args[3]);
    if (scale == -1.0 && PyErr_Occurred()) return NULL;
    Py_buffer *q = get_view(&v, args[0], "q", 'f', 3, 0);
    Py_buffer *out = q ? get_view(&v, args[5], "out", 'f', 3, 1) : NULL;
    Py_buffer *k = out ? get_rows_view(&v, args[1], "k") : NULL;
    Py_buffer *val = k ? get_rows_view(&v, args[2], "v") : NULL;
    if (!val) goto fail;
    if (k->itemsize != val->itemsize) {
        PyErr_SetString(PyExc_ValueError, "attention: k and v must have one dtype");
        goto fail;
    }
    const Py_ssize_t Hq = q->shape[0], L = q->shape[1], D = q->shape[2];
    const Py_ssize_t Hkv = k->shape[0], S = k->shape[1], size = k->itemsize;
    if (k->shape[2] != D || val->shape[0] != Hkv || val->shape[1] != S || val->shape[2] != D ||
        out->shape[0] != Hq || out->shape[1] != L || out->shape[2] != D || Hkv == 0 ||
        Hq % Hkv) {
        PyErr_SetString(PyExc_ValueError, "attention: q, k, v and out shapes do not agree");
        goto fail;
    }
    if (D > ATTN_MAX_DIM) {
        PyErr_Format(PyExc_ValueError, "attention: head dim %zd over %d", D, ATTN_MAX_DIM);
        goto fail;
    }
    const uint8_t *mask = NULL;
    if (args[4] != Py_None) {
        Py_buffer *mv = &v.views[v.count];
        if (PyObject_GetBuffer(args[4], mv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fail;
        v.count++;
        if (mv->itemsize != 1 || mv->ndim != 2 || mv->shape[0] != L || mv->shape[1] != S) {
            PyErr_SetString(PyExc_ValueError, "mask must be a C-contiguous bool [L, S] array");
            goto fail;
        }
        mask = (const uint8_t *)mv->buf;
    }
    const AttnJob job = {.q = (const float *)q->buf,
                         .k = k->buf,
                         .v = val->buf,
                         .mask = mask,
                         .out = (float *)out->buf,
                         .L = L,
                         .S = S,
                         .D = D,
                         .G = Hq / Hkv,
                         .k_head = k->strides[0] / size,
                         .k_row = k->strides[1] / size,
                         .v_head = val->strides[0] / size,
                         .v_row = val->strides[1] / size,
                         .scale = (float)scale,
                         .kv_half = size == 2};
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = run_attention(&job, Hq, L);
    Py_END_ALLOW_THREADS;
    if (status < 0) {
        PyErr_NoMemory();
        goto fail;
    }
    release_views(&v);
    Py_RETURN_NONE;
fail:
    release_views(&v);
    return NULL;
}

PyDoc_STRVAR(ring_attention_doc,
             "ring_attention(q, keys, values, positions, new_k, new_v, offset, window, scale, "
             "out)\n\n"
             "A sliding window's attention as the C step computes it: query row l, at position\n"
             "offset + l, over the keys (pos - window, pos] by position, those below offset from\n"
             "the ring keys/values [Hkv, size, D] (slot p % size, where positions[slot] == p),\n"
             "the others from new_k/new_v [Hkv, L, D]; all four float32 or all float16,\n"
             "C-contiguous; positions int64 [size]; q, out float32 [Hq, L, D].");

static PyObject *py_ring_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "ring_attention takes 10 arguments");
        return NULL;
    }
    Views v = {.count = 0};
    const Py_ssize_t offset = PyLong_AsSsize_t(args[6]), window = PyLong_AsSsize_t(args[7]);
    const double scale = PyFloat_AsDouble(args[8]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer *q = get_view(&v, args[0], "q", 'f', 3, 0);
    Py_buffer *out = q ? get_view(&v, args[9], "out", 'f', 3, 1) : NULL;
    Py_buffer *pos = out ? get_view(&v, args[3], "positions", 'i', 1, 0) : NULL;
    Py_buffer *rows[4] = {NULL};
    const char *names[4] = {"keys", "values", "new_k", "new_v"};
    const int arg_of[4] = {1, 2, 4, 5};
    for (int i = 0; pos && i < 4; i++) {
        rows[i] = get_view(&v, args[arg_of[i]], names[i], 'p', 3, 0);
        if (!rows[i]) goto fail;
    }
    if (!pos) goto fail;
    const Py_ssize_t Hq = q->shape[0], L = q->shape[1], D = q->shape[2];
    const Py_ssize_t Hkv = rows[0]->shape[0], size = rows[0]->shape[1];
    int agree = Hkv > 0 && Hq % Hkv == 0 && pos->shape[0] == size && offset >= 0 &&
                window > 0 && out->shape[0] == Hq && out->shape[1] == L && out->shape[2] == D;
    for (int i = 0; i < 4; i++)
        agree = agree && rows[i]->itemsize == rows[0]->itemsize && rows[i]->shape[0] == Hkv &&
                rows[i]->shape[1] == (i < 2 ? size : L) && rows[i]->shape[2] == D;
    if (!agree || D > ATTN_MAX_DIM) {
        PyErr_SetString(PyExc_ValueError, "ring_attention: shapes, dtypes or window disagree");
        goto fail;
    }
    uint8_t *mask = malloc((size_t)(L * (offset + L)) + 1);
    if (!mask) {
        PyErr_NoMemory();
        goto fail;
    }
    AttnJob job = {.q = (const float *)q->buf, .k = rows[0]->buf, .v = rows[1]->buf,
                   .out = (float *)out->buf, .L = L, .S = offset + L, .D = D, .G = Hq / Hkv,
                   .k_head = size * D, .k_row = D, .v_head = size * D, .v_row = D,
                   .scale = (float)scale, .kv_half = rows[0]->itemsize == 2,
                   .new_k = rows[2]->buf, .new_v = rows[3]->buf, .ring_rows = size,
                   .first_new = offset, .new_head = L * D};
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = run_ring_attention(&job, (const int64_t *)pos->buf, window, mask, Hq);
    Py_END_ALLOW_THREADS;
    free(mask);
    if (status < 0) {
        PyErr_NoMemory();
        goto fail;
    }
    release_views(&v);
    Py_RETURN_NONE;
fail:
    release_views(&v);
    return NULL;
}

PyDoc_STRVAR(dequantize_doc,
             "dequantize(packed, scales, biases, group_size, bits, out, rows=None)\n\n"
             "out[i, :] = dequantize(W)[rows[i], :] (all rows when rows is None); rows int64.");

static PyObject *py_dequantize(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "dequantize takes 6 or 7 arguments");
        return NULL;
    }
    Views v = {.count = 0};
    QMat w;
    Py_buffer *out = get_view(&v, args[5], "out", 'f', 2, 1);
    if (!out) goto fail;
    Py_buffer *packed = get_view(&v, args[0], "packed", 'u', 2, 0);
    if (!packed) goto fail;
    const Py_ssize_t n = packed->shape[0], k = out->shape[1];
    if (get_qmat(&v, args, n, k, &w) < 0) goto fail;
    const int64_t *rows = NULL;
    Py_ssize_t count = n;
    if (nargs == 7 && args[6] != Py_None) {
        Py_buffer *ids = get_view(&v, args[6], "rows", 'i', 1, 0);
        if (!ids) goto fail;
        rows = (const int64_t *)ids->buf;
        count = ids->shape[0];
        for (Py_ssize_t i = 0; i < count; i++) {
            if (rows[i] < 0 || rows[i] >= n) {
                PyErr_Format(PyExc_IndexError, "row %lld out of range for %zd rows",
                             (long long)rows[i], n);
                goto fail;
            }
        }
    }
    if (out->shape[0] != count) {
        PyErr_SetString(PyExc_ValueError, "out must have one row per requested row");
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS;
    run_dequantize(&w, rows, count, (float *)out->buf);
    Py_END_ALLOW_THREADS;
    release_views(&v);
    Py_RETURN_NONE;
fail:
    release_views(&v);
    return NULL;
}

static PyObject *py_set_num_threads(PyObject *self, PyObject *arg) {
    (void)self;
    const long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "the thread count must be at least 1");
        return NULL;
    }
    pool_set_num_threads((int)n);
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLong(pool_num_threads());
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    for (int i = 0; i <= ISA_AVX512; i++) {
        const int built = i == ISA_GENERIC || (i == ISA_AVX2 && HAVE_AVX2) ||
                          (i == ISA_AVX512 && HAVE_AVX512);
        if (strcmp(name, ISA_NAMES[i]) == 0 && built) {
            isa = i;
            Py_RETURN_NONE;
        }
    }
    PyErr_Format(PyExc_ValueError, "code path %R is not built", arg);
    return NULL;
}

static PyObject *py_info(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *built = Py_BuildValue("[s]", ISA_NAMES[ISA_GENERIC]);
    if (!built) return NULL;
    for (int i = ISA_AVX2; i <= ISA_AVX512; i++) {
        if ((i == ISA_AVX2 && HAVE_AVX2) || (i == ISA_AVX512 && HAVE_AVX512)) {
            PyObject *name = PyUnicode_FromString(ISA_NAMES[i]);
            if (!name || PyList_Append(built, name) < 0) {
                Py_XDECREF(name);
                Py_DECREF(built);
                return NULL;
            }
            Py_DECREF(name);
        }
    }
    long long jobs, stalls, wait_ns;
    pool_stats(&jobs, &stalls, &wait_ns);
    return Py_BuildValue("{s:s,s:N,s:O,s:i,s:L,s:L,s:L}", "isa", ISA_NAMES[isa], "built", built,
                         "threads", HAVE_THREADS ? Py_True : Py_False, "num_threads",
                         pool_num_threads(), "parallel_jobs", jobs, "stalls", stalls, "wait_ns",
                         wait_ns);
}

static PyMethodDef methods[] = {
    {"matmul", (PyCFunction)(void (*)(void))py_matmul, METH_FASTCALL, matmul_doc},
    {"dequantize", (PyCFunction)(void (*)(void))py_dequantize, METH_FASTCALL, dequantize_doc},
    {"attention", (PyCFunction)(void (*)(void))py_attention, METH_FASTCALL, attention_doc},
    {"ring_attention", (PyCFunction)(void (*)(void))py_ring_attention, METH_FASTCALL,
     ring_attention_doc},
    {"set_num_threads", py_set_num_threads, METH_O, "Threads for later calls (1 where built without threads)."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "Threads calls use."},
    {"set_isa", py_set_isa, METH_O, "Use one built code path: 'avx512', 'avx2' or 'generic'."},
    {"info", py_info, METH_NOARGS,
     "Code paths (isa in use, built), threads, and pool statistics (parallel_jobs, stalls,\n"
     "wait_ns: time callers waited on workers)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_qmatmul", "Matrix products against packed quantized weights.",
    -1, methods, NULL, NULL, NULL, NULL};

/* Bumped whenever an entry point's arguments change; kernels/qmatmul.py checks it. */
#define ABI_VERSION 4

PyMODINIT_FUNC PyInit__qmatmul(void) {
    if (pool_register_fork_handlers())
        return PyErr_Format(PyExc_RuntimeError, "pthread_atfork failed");
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "ABI_VERSION", ABI_VERSION) < 0) Py_CLEAR(m);
    /* the integer-dot-product kernels (int8_module.c) and the C decode step (step_module.c) */
    if (m && (PyModule_AddFunctions(m, int8_methods) < 0 || PyModule_AddFunctions(m, step_methods) < 0))
        Py_CLEAR(m);
    return m;
}
