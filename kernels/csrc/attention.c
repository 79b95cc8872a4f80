/* Attention for decode-sized rows:
 * out[h, l] = softmax(scale * q[h, l] . k[h/G, :S]^T, masked) @ v[h/G, :S] for the few
 * query rows of a decode or verify step, one (head, row) per chunk. NumPy's batched
 * matmul on the cache's strided views falls back to a slow loop at these sizes. Each row
 * is computed alone, in a fixed order: its result does not depend on how many rows came. */
#include "qmatmul.h"

#include <math.h>
#include <string.h>

/* (head, row) pairs x keys from which the pool pays: for one decode row of the default
 * model (9 heads of 64) a short context runs faster on the calling thread alone, a
 * context of ~1k keys faster on two. */
#define ATTN_PARALLEL_KEYS 3072

#define ATTN_LANES 8 /* partial sums of a dot product: one SIMD register's worth */

/* q . k in ATTN_LANES interleaved partial sums (vectorizes without reassociating). */
static inline float attn_dot(const float *restrict q, const float *restrict k, Py_ssize_t D) {
    float acc[ATTN_LANES] = {0.f};
    Py_ssize_t d = 0;
    for (; d + ATTN_LANES <= D; d += ATTN_LANES)
        for (int i = 0; i < ATTN_LANES; i++) acc[i] += q[d + i] * k[d + i];
    for (; d < D; d++) acc[d % ATTN_LANES] += q[d] * k[d];
    float sum = 0.f;
    for (int i = 0; i < ATTN_LANES; i++) sum += acc[i];
    return sum;
}

static void attention_chunk(const void *ctx, Py_ssize_t item) {
    const AttnJob *j = (const AttnJob *)ctx;
    const Py_ssize_t h = item / j->L, l = item % j->L, D = j->D, S = j->S;
    const float *q = j->q + (h * j->L + l) * D;
    const float *kb = j->k + (h / j->G) * j->k_head;
    const float *vb = j->v + (h / j->G) * j->v_head;
    const uint8_t *mask = j->mask ? j->mask + l * S : NULL;
    float *sc = j->scores + item * S, *out = j->out + (h * j->L + l) * D;
    float m = -INFINITY;
    for (Py_ssize_t s = 0; s < S; s++) {
        if (mask && !mask[s]) {
            sc[s] = -INFINITY;
            continue;
        }
        sc[s] = attn_dot(q, kb + s * j->k_row, D) * j->scale;
        if (sc[s] > m) m = sc[s];
    }
    float acc[ATTN_MAX_DIM] = {0.f};
    if (m == -INFINITY) { /* no visible key */
        memset(out, 0, (size_t)D * sizeof(float));
        return;
    }
    float total = 0.f;
    for (Py_ssize_t s = 0; s < S; s++) {
        if (sc[s] == -INFINITY) continue;
        const float p = expf(sc[s] - m);
        total += p;
        const float *restrict vr = vb + s * j->v_row;
        for (Py_ssize_t d = 0; d < D; d++) acc[d] += p * vr[d];
    }
    const float inv = 1.0f / total;
    for (Py_ssize_t d = 0; d < D; d++) out[d] = acc[d] * inv;
}

void run_attention(const AttnJob *job, Py_ssize_t Hq, Py_ssize_t L) {
    if (Hq * L * job->S >= ATTN_PARALLEL_KEYS) {
        parallel_for(attention_chunk, job, Hq * L, SPIN_NS);
    } else { /* a short context: waking a worker costs more than it saves */
        for (Py_ssize_t i = 0; i < Hq * L; i++) attention_chunk(job, i);
    }
}
