/* Attention for decode-sized rows:
 * out[h, l] = softmax(scale * q[h, l] . k[h/G, :S]^T, masked) @ v[h/G, :S] for the few
 * query rows of a decode or verify step, one (head, row) per chunk. NumPy's batched
 * matmul on the cache's strided views falls back to a slow loop at these sizes. Each row
 * is computed alone, in a fixed order: its result does not depend on how many rows came. */
#include "qmatmul.h"

#include <math.h>
#include <stdlib.h>
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

typedef struct {
    const AttnJob *job;
    float *scores;
} AttnRun;

/* Row s of K or V (base: the kv head's first row) as float32: in place, or into dst. */
static inline const float *kv_row(const AttnJob *j, const void *base, Py_ssize_t s,
                                  Py_ssize_t row_stride, float *dst) {
    if (!j->kv_half) return (const float *)base + s * row_stride;
    const uint16_t *h = (const uint16_t *)base + s * row_stride;
    for (Py_ssize_t d = 0; d < j->D; d++) dst[d] = half_to_float(h[d]);
    return dst;
}

static void attention_chunk(const void *ctx, Py_ssize_t item) {
    const AttnRun *run = (const AttnRun *)ctx;
    const AttnJob *j = run->job;
    const Py_ssize_t h = item / j->L, l = item % j->L, D = j->D, S = j->S;
    const float *q = j->q + (h * j->L + l) * D;
    const size_t itemsize = j->kv_half ? 2 : 4;
    const char *kb = (const char *)j->k + (size_t)((h / j->G) * j->k_head) * itemsize;
    const char *vb = (const char *)j->v + (size_t)((h / j->G) * j->v_head) * itemsize;
    float row[ATTN_MAX_DIM];
    const uint8_t *mask = j->mask ? j->mask + l * S : NULL;
    float *sc = run->scores + item * S, *out = j->out + (h * j->L + l) * D;
    float m = -INFINITY;
    for (Py_ssize_t s = 0; s < S; s++) {
        if (mask && !mask[s]) {
            sc[s] = -INFINITY;
            continue;
        }
        sc[s] = attn_dot(q, kv_row(j, kb, s, j->k_row, row), D) * j->scale;
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
        const float *restrict vr = kv_row(j, vb, s, j->v_row, row);
        for (Py_ssize_t d = 0; d < D; d++) acc[d] += p * vr[d];
    }
    const float inv = 1.0f / total;
    for (Py_ssize_t d = 0; d < D; d++) out[d] = acc[d] * inv;
}

int run_attention(const AttnJob *job, Py_ssize_t Hq, Py_ssize_t L) {
    if (Hq * L == 0) return 0;
    if (job->S == 0) {
        memset(job->out, 0, (size_t)(Hq * L * job->D) * sizeof(float));
        return 0;
    }
    AttnRun run = {job, malloc((size_t)(Hq * L * job->S) * sizeof(float))};
    if (!run.scores) return -1;
    if (Hq * L * job->S >= ATTN_PARALLEL_KEYS) {
        parallel_for(attention_chunk, &run, Hq * L, SPIN_NS);
    } else { /* a short context: waking a worker costs more than it saves */
        for (Py_ssize_t i = 0; i < Hq * L; i++) attention_chunk(&run, i);
    }
    free(run.scores);
    return 0;
}
