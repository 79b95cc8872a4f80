/* The C decode step (step.c): every attention layer of a decoder, then the final norm and
 * the LM head, for the few rows of a decode or verify step, in one call without the GIL.
 *
 * A plan (StepPlan) is built once per model by step_module.c from the model's own arrays
 * (borrowed pointers: the Python side keeps them alive) and describes what each layer
 * computes; a call (step_run) takes the rows' hidden states after the embedding, the
 * layers' KV buffers as they are now and the rope tables, and writes KV rows in place
 * exactly where the Python path would (engine/runner/cpu_step.py moves the cursors).
 *
 * Every row is computed alone and in a fixed order whatever the number of rows and the
 * thread count, so a verify of k rows equals k single steps bit for bit.
 */
#ifndef BRANCHCHAT_STEP_H
#define BRANCHCHAT_STEP_H

#include "int8.h"
#include "qmatmul.h"

#define STEP_MAX_ROWS 64 /* rows one call takes: decode, verify, and prefill in pieces */

enum { PART_QMAT, PART_INT8, PART_DENSE };

/* A block of a projection's output columns: a packed matrix (its rows are the block's
 * columns; matmul.c's float kernel or int8.h's integer one) or a dense float32 [k, cols]
 * one, as the NumPy backend holds float weights. */
typedef struct {
    int kind;
    QMat q;
    I8Mat i8;
    const float *dense;
    Py_ssize_t col0, cols;
} LinearPart;

/* out[m, n] = x[m, k] @ W^T, W one or more column blocks (kernels/row_parts.py). */
typedef struct {
    LinearPart *parts;
    int num_parts;
    Py_ssize_t n, k;
} Linear;

enum { ACT_SILU, ACT_GELU_TANH };

typedef struct {
    Linear qkv, o, gate_up, down;
    const float *input_norm, *post_norm;  /* post_norm: before the MLP, or Gemma's after attention */
    const float *pre_ffw_norm, *post_ffw_norm; /* Gemma 3's sandwich; NULL elsewhere */
    const float *qkv_bias;                /* [(H + 2 Hkv) Dh] or NULL */
    const float *q_norm, *k_norm;         /* [Dh] or NULL */
    int rope;                             /* index into the plan's ropes and the call's tables */
    Py_ssize_t window;                    /* 0: full attention; else a sliding ring */
    float scale;
} StepLayer;

typedef struct {
    int dims, traditional;
    float mscale; /* multiplies cos and sin (yarn's attention factor) */
} StepRope;

typedef struct {
    Py_ssize_t D, H, Hkv, Dh, F, V;
    float eps;
    int act;
    int num_layers, num_ropes;
    StepLayer *layers;
    StepRope *ropes;
    const float *final_norm;
    Linear head;
} StepPlan;

/* One layer's KV rows for a call, float32 or float16 (half: each row rounded once when
 * written, and read back rounded, the forward's own rows included: engine/kv_state.py).
 * Full attention: keys/values [Hkv, capacity, Dh], rows [offset, offset + L) written in
 * place. Sliding: the ring [Hkv, size, Dh] and each slot's position, read only; the
 * call's rows go to new_k/new_v [Hkv, L, Dh], which the ring takes at the forward's end
 * (engine/sliding_kv.py). */
typedef struct {
    void *keys, *values;
    const int64_t *positions; /* NULL: full attention */
    void *new_k, *new_v;
    Py_ssize_t rows; /* capacity, or the ring's size */
    int half;
} StepKV;

typedef struct {
    const float *cos, *sin; /* [positions, dims / 2] */
} RopeTable;

/* Layers whose outputs a call also copies out (a block drafter's context rows): rising
 * layer numbers, and out [L, count * D], row r holding each tapped layer's row r in turn. */
typedef struct {
    const int *layers;
    int count;
    float *out;
} StepTaps;

/* x [L, D] (the scaled embeddings) becomes the last hidden states; logits [logit_rows, V]
 * for the last logit_rows rows (0: none); taps NULL or the layers to copy out. Returns 0,
 * or -1 when scratch memory ran out (nothing is half-written that the caller's undo does
 * not cover). */
int step_run(const StepPlan *plan, float *x, Py_ssize_t L, Py_ssize_t offset, const StepKV *kv,
             const RopeTable *tables, float *logits, Py_ssize_t logit_rows, const StepTaps *taps);

#endif /* BRANCHCHAT_STEP_H */
