/* The Python entry points of the C decode step (added to kernels._qmatmul by module.c):
 *
 *   step_plan(...) -> a StepPlan object holding borrowed views of one model's arrays
 *   step_run(plan, x, offset, kv, tables, logits[, taps])
 *
 * Every shape is checked here, once per plan or once per call, so step.c reads its
 * pointers without checks; engine/runner/cpu_step.py builds the arguments. */
#include "step.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    PyObject_HEAD StepPlan plan;
    Py_buffer *views; /* held for the plan's lifetime: the arrays stay alive and unmoved */
    Py_ssize_t num_views, cap_views;
    LinearPart **part_blocks; /* each Linear's parts, freed with the plan */
    Py_ssize_t num_blocks;
} PlanObject;

/* -- views ---------------------------------------------------------------------------- */

/* A C-contiguous buffer of `ndim` dims whose items are `kind`: 'f' float32, 'p' float32 or
 * float16, 'u' uint32, 'i' int64. */
static int view_of(PyObject *obj, Py_buffer *view, const char *name, char kind, int ndim,
                   int writable) {
    const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *format = view->format ? view->format : "B";
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') format++;
    const char *accepted = kind == 'f' ? "f" : kind == 'p' ? "fe" : kind == 'u' ? "IL" : "lq";
    const Py_ssize_t itemsize = kind == 'i' ? 8 : kind == 'p' && format[0] == 'e' ? 2 : 4;
    if (view->itemsize == itemsize && strlen(format) == 1 && strchr(accepted, format[0]) &&
        view->ndim == ndim)
        return 0;
    const char *what = kind == 'f'   ? "float32"
                       : kind == 'p' ? "float32 or float16"
                       : kind == 'u' ? "uint32"
                                     : "int64";
    PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous %d-D %s array", name, ndim, what);
    PyBuffer_Release(view);
    return -1;
}

/* Room for `count` more held views. */
static int reserve_views(PlanObject *po, Py_ssize_t count) {
    if (po->num_views + count > po->cap_views) {
        const Py_ssize_t cap = 2 * (po->cap_views + count);
        Py_buffer *grown = realloc(po->views, (size_t)cap * sizeof(Py_buffer));
        if (!grown) return PyErr_NoMemory(), -1;
        po->views = grown;
        po->cap_views = cap;
    }
    return 0;
}

static Py_buffer *hold(PlanObject *po, PyObject *obj, const char *name, char kind, int ndim) {
    if (reserve_views(po, 1) < 0) return NULL;
    Py_buffer *view = &po->views[po->num_views];
    if (view_of(obj, view, name, kind, ndim, 0) < 0) return NULL;
    po->num_views++;
    return view;
}

/* A float32 vector of n elements, or NULL for None where `optional`. */
static int hold_vector(PlanObject *po, PyObject *obj, Py_ssize_t n, const char *name, int optional,
                       const float **out) {
    *out = NULL;
    if (obj == Py_None && optional) return 0;
    Py_buffer *v = hold(po, obj, name, 'f', 1);
    if (!v) return -1;
    if (v->shape[0] != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd elements, expected %zd", name, v->shape[0], n);
        return -1;
    }
    *out = v->buf;
    return 0;
}

/* ("q", packed, scales, biases, group_size, bits), ("i", Int8Matrix) or ("f", dense
 * [k, cols]). */
static int hold_part(PlanObject *po, PyObject *spec, Py_ssize_t k, LinearPart *part) {
    const char *kind = PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) > 0
                           ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0))
                           : NULL;
    if (kind && strcmp(kind, "i") == 0 && PyTuple_GET_SIZE(spec) == 2) {
        if (reserve_views(po, 4) < 0) return -1;
        int taken = 0;
        const int rc = i8mat_from_object(PyTuple_GET_ITEM(spec, 1), &part->i8,
                                         po->views + po->num_views, &taken);
        po->num_views += taken; /* released with the plan, also after a failure */
        if (rc < 0) return -1;
        if (part->i8.k != k) {
            PyErr_Format(PyExc_ValueError, "an int8 weight has k=%zd, expected %zd", part->i8.k, k);
            return -1;
        }
        part->kind = PART_INT8;
        part->cols = part->i8.n;
        return 0;
    }
    if (kind && strcmp(kind, "f") == 0 && PyTuple_GET_SIZE(spec) == 2) {
        Py_buffer *w = hold(po, PyTuple_GET_ITEM(spec, 1), "a dense weight", 'f', 2);
        if (!w) return -1;
        if (w->shape[0] != k) {
            PyErr_Format(PyExc_ValueError, "a dense weight is [%zd, _], expected k=%zd",
                         w->shape[0], k);
            return -1;
        }
        part->kind = PART_DENSE;
        part->dense = w->buf;
        part->cols = w->shape[1];
        return 0;
    }
    if (!kind || strcmp(kind, "q") != 0 || PyTuple_GET_SIZE(spec) != 6) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a weight part is ('q', packed, scales, biases, "
                                              "group_size, bits), ('i', Int8Matrix) or "
                                              "('f', dense)");
        return -1;
    }
    const long group = PyLong_AsLong(PyTuple_GET_ITEM(spec, 4));
    const long bits = PyLong_AsLong(PyTuple_GET_ITEM(spec, 5));
    if (PyErr_Occurred()) return -1;
    Py_buffer *packed = hold(po, PyTuple_GET_ITEM(spec, 1), "packed", 'u', 2);
    Py_buffer *scales = packed ? hold(po, PyTuple_GET_ITEM(spec, 2), "scales", 'p', 2) : NULL;
    Py_buffer *biases = scales ? hold(po, PyTuple_GET_ITEM(spec, 3), "biases", 'p', 2) : NULL;
    if (!biases) return -1;
    const int bits_ok = bits >= 2 && bits <= 8 && bits != 7;
    const int group_ok = group == 16 || (group > 0 && group % CHUNK == 0);
    const Py_ssize_t n = packed->shape[0];
    if (!bits_ok || !group_ok || k % group || k % CHUNK || packed->shape[1] * 32 != k * bits ||
        scales->itemsize != biases->itemsize || scales->shape[0] != n || biases->shape[0] != n ||
        scales->shape[1] != k / group || biases->shape[1] != k / group) {
        PyErr_Format(PyExc_ValueError, "a packed weight does not match k=%zd at %ld bits, group %ld",
                     k, bits, group);
        return -1;
    }
    part->kind = PART_QMAT;
    part->q = (QMat){packed->buf, scales->buf, biases->buf, n, k, (int)group, (int)bits,
                     scales->itemsize == 2};
    part->cols = n;
    return 0;
}

/* A tuple of parts, their columns in order, n columns over k inputs in all. */
static int hold_linear(PlanObject *po, PyObject *spec, Py_ssize_t n, Py_ssize_t k,
                       const char *name, Linear *lin) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 1) {
        PyErr_Format(PyExc_ValueError, "%s must be a tuple of weight parts", name);
        return -1;
    }
    const Py_ssize_t count = PyTuple_GET_SIZE(spec);
    LinearPart **blocks = realloc(po->part_blocks, (size_t)(po->num_blocks + 1) * sizeof *blocks);
    if (!blocks) return PyErr_NoMemory(), -1;
    po->part_blocks = blocks;
    LinearPart *parts = calloc((size_t)count, sizeof(LinearPart));
    if (!parts) return PyErr_NoMemory(), -1;
    blocks[po->num_blocks++] = parts;
    Py_ssize_t col = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (hold_part(po, PyTuple_GET_ITEM(spec, i), k, &parts[i]) < 0) return -1;
        parts[i].col0 = col;
        col += parts[i].cols;
    }
    if (col != n) {
        PyErr_Format(PyExc_ValueError, "%s has %zd output columns, expected %zd", name, col, n);
        return -1;
    }
    *lin = (Linear){parts, (int)count, n, k};
    return 0;
}

/* -- the plan ------------------------------------------------------------------------- */

static void plan_dealloc(PlanObject *po) {
    for (Py_ssize_t i = 0; i < po->num_views; i++) PyBuffer_Release(&po->views[i]);
    for (Py_ssize_t i = 0; i < po->num_blocks; i++) free(po->part_blocks[i]);
    free(po->views);
    free(po->part_blocks);
    free(po->plan.layers);
    free(po->plan.ropes);
    Py_TYPE(po)->tp_free((PyObject *)po);
}

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kernels._qmatmul.StepPlan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One model's weights as the C decode step reads them (see step_plan).",
};

/* Layer tuple: (input_norm, post_norm, pre_ffw_norm, post_ffw_norm, qkv, qkv_bias, q_norm,
 * k_norm, o, gate_up, down, rope, window, scale). */
static int hold_layer(PlanObject *po, PyObject *spec, StepLayer *ly) {
    StepPlan *p = &po->plan;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 14) {
        PyErr_SetString(PyExc_ValueError, "a layer is a tuple of 14 items");
        return -1;
    }
    PyObject *const *it = &PyTuple_GET_ITEM(spec, 0);
    const Py_ssize_t D = p->D, hd = p->H * p->Dh, nqkv = (p->H + 2 * p->Hkv) * p->Dh;
    if (hold_vector(po, it[0], D, "input_norm", 0, &ly->input_norm) < 0 ||
        hold_vector(po, it[1], D, "post_norm", 0, &ly->post_norm) < 0 ||
        hold_vector(po, it[2], D, "pre_ffw_norm", 1, &ly->pre_ffw_norm) < 0 ||
        hold_vector(po, it[3], D, "post_ffw_norm", 1, &ly->post_ffw_norm) < 0 ||
        hold_linear(po, it[4], nqkv, D, "qkv", &ly->qkv) < 0 ||
        hold_vector(po, it[5], nqkv, "qkv_bias", 1, &ly->qkv_bias) < 0 ||
        hold_vector(po, it[6], p->Dh, "q_norm", 1, &ly->q_norm) < 0 ||
        hold_vector(po, it[7], p->Dh, "k_norm", 1, &ly->k_norm) < 0 ||
        hold_linear(po, it[8], D, hd, "o", &ly->o) < 0 ||
        hold_linear(po, it[9], 2 * p->F, D, "gate_up", &ly->gate_up) < 0 ||
        hold_linear(po, it[10], D, p->F, "down", &ly->down) < 0)
        return -1;
    const long rope = PyLong_AsLong(it[11]);
    ly->window = PyLong_AsSsize_t(it[12]);
    ly->scale = (float)PyFloat_AsDouble(it[13]);
    if (PyErr_Occurred()) return -1;
    ly->rope = (int)rope;
    if (rope < 0 || rope >= p->num_ropes || ly->window < 0 ||
        (ly->pre_ffw_norm == NULL) != (ly->post_ffw_norm == NULL) ||
        (ly->q_norm == NULL) != (ly->k_norm == NULL)) {
        PyErr_SetString(PyExc_ValueError, "a layer's rope index, window or norms are invalid");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(step_plan_doc,
             "step_plan(sizes, eps, act, ropes, final_norm, head, layers) -> StepPlan\n\n"
             "sizes (D, H, Hkv, Dh, F, V); act 0 silu, 1 gelu_tanh; ropes ((dims, traditional,\n"
             "mscale), ...); head and each projection a tuple of parts ('q', packed, scales,\n"
             "biases, group_size, bits) or ('f', dense [k, cols]); layers as step_module.c says.");

static PyObject *py_step_plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "step_plan takes 7 arguments");
        return NULL;
    }
    if (PyType_Ready(&PlanType) < 0) return NULL;
    PlanObject *po = PyObject_New(PlanObject, &PlanType);
    if (!po) return NULL;
    memset(&po->plan, 0, sizeof po->plan);
    po->views = NULL;
    po->part_blocks = NULL;
    po->num_views = po->cap_views = po->num_blocks = 0;
    StepPlan *p = &po->plan;
    if (!PyArg_ParseTuple(args[0], "nnnnnn", &p->D, &p->H, &p->Hkv, &p->Dh, &p->F, &p->V))
        goto fail;
    p->eps = (float)PyFloat_AsDouble(args[1]);
    p->act = (int)PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) goto fail;
    if (p->D <= 0 || p->H <= 0 || p->Hkv <= 0 || p->H % p->Hkv || p->Dh <= 0 ||
        p->Dh > ATTN_MAX_DIM || p->F <= 0 || p->V <= 0 || (p->act != ACT_SILU && p->act != ACT_GELU_TANH)) {
        PyErr_SetString(PyExc_ValueError, "step_plan: sizes or activation out of range");
        goto fail;
    }
    if (!PyTuple_Check(args[3]) || !PyTuple_Check(args[6])) {
        PyErr_SetString(PyExc_ValueError, "step_plan: ropes and layers must be tuples");
        goto fail;
    }
    p->num_ropes = (int)PyTuple_GET_SIZE(args[3]);
    p->ropes = calloc((size_t)p->num_ropes + 1, sizeof(StepRope));
    p->num_layers = (int)PyTuple_GET_SIZE(args[6]);
    p->layers = calloc((size_t)p->num_layers + 1, sizeof(StepLayer));
    if (!p->ropes || !p->layers) {
        PyErr_NoMemory();
        goto fail;
    }
    for (int i = 0; i < p->num_ropes; i++) {
        StepRope *r = &p->ropes[i];
        double mscale;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(args[3], i), "iid", &r->dims, &r->traditional,
                              &mscale))
            goto fail;
        r->mscale = (float)mscale;
        if (r->dims <= 0 || r->dims % 2 || r->dims > p->Dh) {
            PyErr_Format(PyExc_ValueError, "rope dims %d must be even and at most %zd", r->dims,
                         p->Dh);
            goto fail;
        }
    }
    if (hold_vector(po, args[4], p->D, "final_norm", 0, &p->final_norm) < 0 ||
        hold_linear(po, args[5], p->V, p->D, "head", &p->head) < 0)
        goto fail;
    for (int i = 0; i < p->num_layers; i++)
        if (hold_layer(po, PyTuple_GET_ITEM(args[6], i), &p->layers[i]) < 0) goto fail;
    return (PyObject *)po;
fail:
    Py_DECREF(po);
    return NULL;
}

/* -- a call --------------------------------------------------------------------------- */

typedef struct {
    Py_buffer *views;
    Py_ssize_t count;
} CallViews;

static Py_buffer *call_view(CallViews *cv, PyObject *obj, const char *name, char kind, int ndim,
                            int writable) {
    Py_buffer *view = &cv->views[cv->count];
    if (view_of(obj, view, name, kind, ndim, writable) < 0) return NULL;
    cv->count++;
    return view;
}

static int shape3(const Py_buffer *v, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c) {
    return v->shape[0] == a && (b < 0 || v->shape[1] == b) && v->shape[2] == c;
}

/* One layer's KV argument: (keys, values) for full attention, (keys, values, positions,
 * new_k, new_v) for a sliding ring. */
static int call_kv(CallViews *cv, const StepPlan *p, const StepLayer *ly, PyObject *spec,
                   Py_ssize_t L, Py_ssize_t offset, StepKV *kv) {
    const Py_ssize_t want = ly->window ? 5 : 2;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != want) {
        PyErr_Format(PyExc_ValueError, "a %s layer's KV argument is a tuple of %zd arrays",
                     ly->window ? "sliding" : "full-attention", want);
        return -1;
    }
    PyObject *const *it = &PyTuple_GET_ITEM(spec, 0);
    Py_buffer *k = call_view(cv, it[0], "keys", 'p', 3, !ly->window);
    Py_buffer *v = k ? call_view(cv, it[1], "values", 'p', 3, !ly->window) : NULL;
    if (!v) return -1;
    const Py_ssize_t rows = k->shape[1];
    if (!shape3(k, p->Hkv, rows, p->Dh) || !shape3(v, p->Hkv, rows, p->Dh) ||
        k->itemsize != v->itemsize) {
        PyErr_SetString(PyExc_ValueError, "KV buffers must be [Hkv, rows, Dh] alike, one dtype");
        return -1;
    }
    *kv = (StepKV){k->buf, v->buf, NULL, NULL, NULL, rows, k->itemsize == 2};
    if (!ly->window) {
        if (rows < offset + L) {
            PyErr_Format(PyExc_ValueError, "KV capacity %zd is short of %zd rows", rows, offset + L);
            return -1;
        }
        return 0;
    }
    Py_buffer *pos = call_view(cv, it[2], "positions", 'i', 1, 0);
    Py_buffer *nk = pos ? call_view(cv, it[3], "new_k", 'p', 3, 1) : NULL;
    Py_buffer *nv = nk ? call_view(cv, it[4], "new_v", 'p', 3, 1) : NULL;
    if (!nv) return -1;
    if (pos->shape[0] != rows || rows < ly->window || !shape3(nk, p->Hkv, L, p->Dh) ||
        !shape3(nv, p->Hkv, L, p->Dh) || nk->itemsize != k->itemsize ||
        nv->itemsize != k->itemsize) {
        PyErr_SetString(PyExc_ValueError, "a ring's positions must be [size >= window], new "
                                          "rows [Hkv, L, Dh] in the ring's dtype");
        return -1;
    }
    kv->positions = pos->buf;
    kv->new_k = nk->buf;
    kv->new_v = nv->buf;
    return 0;
}

PyDoc_STRVAR(step_run_doc,
             "step_run(plan, x, offset, kv, tables, logits[, taps])\n\n"
             "Run every layer on x [L, D] (float32, overwritten with the last hidden states)\n"
             "at positions offset.., L <= 64; kv one tuple per layer (see call_kv); tables\n"
             "((cos, sin), ...) [positions, dims / 2] per rope; logits None or [R, V] for the\n"
             "last R rows; taps None or ((layer, ...) rising, out [L, count * D] float32):\n"
             "those layers' outputs side by side.");

/* The taps argument: None, or ((layer, ...), out); layers rising, below num_layers. */
static int call_taps(CallViews *cv, const StepPlan *p, PyObject *spec, Py_ssize_t L,
                     int *layers, StepTaps *taps) {
    if (spec == Py_None) return 0;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2 ||
        !PyTuple_Check(PyTuple_GET_ITEM(spec, 0))) {
        PyErr_SetString(PyExc_ValueError, "taps is None or ((layer, ...), out)");
        return -1;
    }
    PyObject *numbers = PyTuple_GET_ITEM(spec, 0);
    const Py_ssize_t count = PyTuple_GET_SIZE(numbers);
    if (count < 1 || count > p->num_layers) {
        PyErr_Format(PyExc_ValueError, "taps names 1..%d layers", p->num_layers);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        const long layer = PyLong_AsLong(PyTuple_GET_ITEM(numbers, i));
        if (layer == -1 && PyErr_Occurred()) return -1;
        if (layer < 0 || layer >= p->num_layers || (i > 0 && layer <= layers[i - 1])) {
            PyErr_Format(PyExc_ValueError, "taps are rising layer numbers below %d",
                         p->num_layers);
            return -1;
        }
        layers[i] = (int)layer;
    }
    Py_buffer *out = call_view(cv, PyTuple_GET_ITEM(spec, 1), "taps out", 'f', 2, 1);
    if (!out) return -1;
    if (out->shape[0] != L || out->shape[1] != count * p->D) {
        PyErr_Format(PyExc_ValueError, "taps out must be [%zd, %zd]", L, count * p->D);
        return -1;
    }
    *taps = (StepTaps){layers, (int)count, out->buf};
    return 1;
}

static PyObject *py_step_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "step_run takes 6 or 7 arguments");
        return NULL;
    }
    if (PyType_Ready(&PlanType) < 0) return NULL;
    if (!PyObject_TypeCheck(args[0], &PlanType)) {
        PyErr_SetString(PyExc_TypeError, "step_run needs a StepPlan");
        return NULL;
    }
    const StepPlan *p = &((PlanObject *)args[0])->plan;
    const Py_ssize_t offset = PyLong_AsSsize_t(args[2]);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    if (!PyTuple_Check(args[3]) || PyTuple_GET_SIZE(args[3]) != p->num_layers ||
        !PyTuple_Check(args[4]) || PyTuple_GET_SIZE(args[4]) != p->num_ropes || offset < 0) {
        PyErr_SetString(PyExc_ValueError, "step_run: one KV tuple per layer, one table per rope");
        return NULL;
    }
    const Py_ssize_t max_views = 3 + 5 * (Py_ssize_t)p->num_layers + 2 * p->num_ropes;
    CallViews cv = {calloc((size_t)max_views, sizeof(Py_buffer)), 0};
    StepKV *kv = calloc((size_t)p->num_layers + 1, sizeof(StepKV));
    RopeTable *tables = calloc((size_t)p->num_ropes + 1, sizeof(RopeTable));
    int *tap_layers = calloc((size_t)p->num_layers + 1, sizeof(int));
    PyObject *result = NULL;
    if (!cv.views || !kv || !tables || !tap_layers) {
        PyErr_NoMemory();
        goto done;
    }
    Py_buffer *x = call_view(&cv, args[1], "x", 'f', 2, 1);
    if (!x) goto done;
    const Py_ssize_t L = x->shape[0];
    if (L < 1 || L > STEP_MAX_ROWS || x->shape[1] != p->D) {
        PyErr_Format(PyExc_ValueError, "x must be [1..%d, %zd]", STEP_MAX_ROWS, p->D);
        goto done;
    }
    for (int i = 0; i < p->num_ropes; i++) {
        PyObject *pair = PyTuple_GET_ITEM(args[4], i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_ValueError, "a rope table is a (cos, sin) pair");
            goto done;
        }
        Py_buffer *c = call_view(&cv, PyTuple_GET_ITEM(pair, 0), "cos", 'f', 2, 0);
        Py_buffer *s = c ? call_view(&cv, PyTuple_GET_ITEM(pair, 1), "sin", 'f', 2, 0) : NULL;
        if (!s) goto done;
        const Py_ssize_t half = p->ropes[i].dims / 2;
        if (c->shape[0] < offset + L || c->shape[1] != half || s->shape[0] != c->shape[0] ||
            s->shape[1] != half) {
            PyErr_Format(PyExc_ValueError, "rope table %d must be [>= %zd, %zd]", i, offset + L,
                         half);
            goto done;
        }
        tables[i] = (RopeTable){c->buf, s->buf};
    }
    for (int i = 0; i < p->num_layers; i++)
        if (call_kv(&cv, p, &p->layers[i], PyTuple_GET_ITEM(args[3], i), L, offset, &kv[i]) < 0)
            goto done;
    float *logits = NULL;
    Py_ssize_t logit_rows = 0;
    if (args[5] != Py_None) {
        Py_buffer *out = call_view(&cv, args[5], "logits", 'f', 2, 1);
        if (!out) goto done;
        logit_rows = out->shape[0];
        if (logit_rows < 1 || logit_rows > L || out->shape[1] != p->V) {
            PyErr_Format(PyExc_ValueError, "logits must be [1..%zd, %zd]", L, p->V);
            goto done;
        }
        logits = out->buf;
    }
    StepTaps taps;
    const int tapped = nargs == 7 ? call_taps(&cv, p, args[6], L, tap_layers, &taps) : 0;
    if (tapped < 0) goto done;
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = step_run(p, x->buf, L, offset, kv, tables, logits, logit_rows, tapped ? &taps : NULL);
    Py_END_ALLOW_THREADS;
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < cv.count; i++) PyBuffer_Release(&cv.views[i]);
    free(cv.views);
    free(kv);
    free(tables);
    free(tap_layers);
    return result;
}

PyMethodDef step_methods[] = {
    {"step_plan", (PyCFunction)(void (*)(void))py_step_plan, METH_FASTCALL, step_plan_doc},
    {"step_run", (PyCFunction)(void (*)(void))py_step_run, METH_FASTCALL, step_run_doc},
    {NULL, NULL, 0, NULL}};
