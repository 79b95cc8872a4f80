/* The Python entry points of the integer-dot-product kernels (added to kernels._qmatmul by
 * module.c): int8_matmul, int8_dequantize, and the choice of code path. */
#include "int8.h"

/* A float32 2-D view with a contiguous last axis (C-contiguous unless `strided`: an
 * output may be some columns of a wider array). */
static int f32_2d(PyObject *obj, const char *name, int writable, int strided, Py_buffer *view) {
    const int flags = (strided ? PyBUF_STRIDES : PyBUF_C_CONTIGUOUS) | PyBUF_FORMAT |
                      (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    if (view->itemsize != 4 || strcmp(f, "f") != 0 || view->ndim != 2 ||
        (strided && (view->strides[1] != 4 || view->strides[0] % 4 ||
                     view->strides[0] < 4 * view->shape[1]))) {
        PyErr_Format(PyExc_ValueError, "%s must be a 2-D float32 array with contiguous rows",
                     name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static void release(Py_buffer *views, int count) {
    for (int i = 0; i < count; i++) PyBuffer_Release(&views[i]);
}

PyDoc_STRVAR(int8_matmul_doc,
             "int8_matmul(w, x, out)\n\n"
             "out[m, n] = x[m, k] @ W^T for an Int8Matrix w; x and out C-contiguous float32.");

static PyObject *py_int8_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "int8_matmul takes 3 arguments");
        return NULL;
    }
    Py_buffer views[6];
    int count = 0, status = -1;
    I8Mat w;
    if (i8mat_from_object(args[0], &w, views, &count) < 0) goto done;
    if (f32_2d(args[1], "x", 0, 0, &views[count]) < 0) goto done;
    const Py_buffer *x = &views[count++];
    if (f32_2d(args[2], "out", 1, 1, &views[count]) < 0) goto done;
    const Py_buffer *out = &views[count++];
    const Py_ssize_t m = x->shape[0];
    if (x->shape[1] != w.k || out->shape[0] != m || out->shape[1] != w.n) {
        PyErr_Format(PyExc_ValueError, "int8_matmul: x must be [m, %zd] and out [m, %zd]", w.k,
                     w.n);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    status = i8_matmul(&w, (const float *)x->buf, m, (float *)out->buf, out->strides[0] / 4);
    Py_END_ALLOW_THREADS;
    if (status < 0) PyErr_NoMemory();
done:
    release(views, count);
    if (status < 0) return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(int8_dequantize_doc,
             "int8_dequantize(w, out, rows=None)\n\n"
             "out[i, :] = W[rows[i], :] in float32 (all rows when rows is None); rows int64.");

static PyObject *py_int8_dequantize(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "int8_dequantize takes 2 or 3 arguments");
        return NULL;
    }
    Py_buffer views[6];
    int count = 0, status = -1;
    I8Mat w;
    if (i8mat_from_object(args[0], &w, views, &count) < 0) goto done;
    if (f32_2d(args[1], "out", 1, 0, &views[count]) < 0) goto done;
    const Py_buffer *out = &views[count++];
    const int64_t *rows = NULL;
    Py_ssize_t num_rows = w.n;
    if (nargs == 3 && args[2] != Py_None) {
        Py_buffer *ids = &views[count];
        if (PyObject_GetBuffer(args[2], ids, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
        count++;
        if (ids->itemsize != 8 || ids->ndim != 1 || !ids->format || !strchr("lq", ids->format[0])) {
            PyErr_SetString(PyExc_ValueError, "rows must be a C-contiguous 1-D int64 array");
            goto done;
        }
        rows = (const int64_t *)ids->buf;
        num_rows = ids->shape[0];
        for (Py_ssize_t i = 0; i < num_rows; i++) {
            if (rows[i] < 0 || rows[i] >= w.n) {
                PyErr_Format(PyExc_IndexError, "row %lld out of range for %zd rows",
                             (long long)rows[i], w.n);
                goto done;
            }
        }
    }
    if (out->shape[0] != num_rows || out->shape[1] != w.k) {
        PyErr_Format(PyExc_ValueError, "out must be [%zd, %zd]", num_rows, w.k);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    i8_dequantize(&w, rows, num_rows, (float *)out->buf);
    Py_END_ALLOW_THREADS;
    status = 0;
done:
    release(views, count);
    if (status < 0) return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(int8_quantize_doc,
             "int8_quantize(x, group_size, xq, d, xb)\n\n"
             "x [m, k] float32 quantized as the kernels do (int8.h): xq int8 [levels, m, k],\n"
             "d float32 [levels, m, k / 32], xb [m, k / group_size], all C-contiguous; levels\n"
             "1 or 2 (the residual's second level) from xq's size (for tests).");

static PyObject *py_int8_quantize(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "int8_quantize takes 5 arguments");
        return NULL;
    }
    const long group_size = PyLong_AsLong(args[1]);
    if (group_size == -1 && PyErr_Occurred()) return NULL;
    Py_buffer views[4];
    int count = 0, status = -1;
    int32_t *hsum = NULL;
    int levels = 1;
    if (f32_2d(args[0], "x", 0, 0, &views[count]) < 0) goto done;
    const Py_buffer *x = &views[count++];
    const Py_ssize_t m = x->shape[0], k = x->shape[1];
    if (k % I8_BLOCK || !(group_size == 16 || (group_size > 0 && group_size % I8_BLOCK == 0)) ||
        k % group_size) {
        PyErr_SetString(PyExc_ValueError, "int8_quantize: k and group_size do not fit");
        goto done;
    }
    if (PyObject_GetBuffer(args[2], &views[count], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    const Py_buffer *xq = &views[count++];
    if (f32_2d(args[3], "d", 1, 0, &views[count]) < 0) goto done;
    const Py_buffer *d = &views[count++];
    if (f32_2d(args[4], "xb", 1, 0, &views[count]) < 0) goto done;
    const Py_buffer *xb = &views[count++];
    levels = m > 0 && xq->len == 2 * m * k ? 2 : 1;
    if (xq->len != levels * m * k || d->len != levels * m * (k / I8_BLOCK) * 4 ||
        xb->len != m * (k / group_size) * 4) {
        PyErr_SetString(PyExc_ValueError, "int8_quantize: xq, d or xb has the wrong size");
        goto done;
    }
    if (!(hsum = malloc(sizeof(int32_t) * (size_t)(2 * (k / 16) + 1)))) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < m; r++) {
        int8_t *q = (int8_t *)xq->buf;
        float *dd = (float *)d->buf;
        const I8Row row = {q + r * k,
                           dd + r * (k / I8_BLOCK),
                           (float *)xb->buf + r * (k / group_size),
                           hsum,
                           levels == 2 ? q + (m + r) * k : NULL,
                           levels == 2 ? dd + (m + r) * (k / I8_BLOCK) : NULL,
                           levels == 2 ? hsum + k / 16 : NULL};
        i8_quantize_row((const float *)x->buf + r * k, k, (int)group_size, &row);
    }
    status = 0;
done:
    free(hsum);
    release(views, count);
    if (status < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_set_int8_path(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    for (int p = 0; p < I8_NUM_PATHS; p++) {
        if (strcmp(name, I8_PATH_NAMES[p]) == 0) {
            if (!i8_path_supported(p))
                return PyErr_Format(PyExc_ValueError, "int8 path %R: this CPU lacks it", arg);
            i8_path = p;
            Py_RETURN_NONE;
        }
    }
    return PyErr_Format(PyExc_ValueError, "unknown int8 path %R", arg);
}

static PyObject *py_int8_info(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *supported = PyList_New(0);
    if (!supported) return NULL;
    for (int p = 0; p < I8_NUM_PATHS; p++) {
        if (!i8_path_supported(p)) continue;
        PyObject *name = PyUnicode_FromString(I8_PATH_NAMES[p]);
        if (!name || PyList_Append(supported, name) < 0) {
            Py_XDECREF(name);
            Py_DECREF(supported);
            return NULL;
        }
        Py_DECREF(name);
    }
    return Py_BuildValue("{s:s,s:N}", "path", I8_PATH_NAMES[i8_current_path()], "supported", supported);
}

PyMethodDef int8_methods[] = {
    {"int8_matmul", (PyCFunction)(void (*)(void))py_int8_matmul, METH_FASTCALL, int8_matmul_doc},
    {"int8_dequantize", (PyCFunction)(void (*)(void))py_int8_dequantize, METH_FASTCALL,
     int8_dequantize_doc},
    {"int8_quantize", (PyCFunction)(void (*)(void))py_int8_quantize, METH_FASTCALL,
     int8_quantize_doc},
    {"set_int8_path", py_set_int8_path, METH_O,
     "Use one int8 code path: 'avx512vnni', 'avxvnni', 'avx2' or 'generic'."},
    {"int8_info", py_int8_info, METH_NOARGS, "The int8 code path in use and those this CPU runs."},
    {NULL, NULL, 0, NULL}};
