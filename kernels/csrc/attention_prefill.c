/* The AVX-512 tiles of attention for a prefill chunk's many query rows (L > ATTN_MANY_ROWS
 * per head; attention.c splits the work and merges the partials as for decode rows).
 *
 * With ~100 rows per kv head a key block is worth rearranging once: K goes transposed
 * ([D, 64 keys]), so a register tile scores 4 rows x 64 keys with one broadcast FMA per
 * element and no horizontal sums (decode's tiles spend ~3 shuffles a key on those), and
 * P V runs 4 rows x 64 dims per tile. A row folds the blocks of a span into one partial
 * as flash attention does (Dao et al. 2022): the running max m rises to each block's, the
 * partial so far is scaled by exp(m_old - m) and the block's exp(s - m) v added. Causal
 * and window masks skip the blocks no row of the chunk sees; keys no row sees are zeroed
 * in the block copy, never weighted by 0. */
#include "attention.h"

#if ATTN_AVX512

#define QUAD 4 /* query rows per register tile */

/* The block's keys transposed into kt [D, ATTN_BLOCK] and its values into vb [ATTN_BLOCK,
 * D], both float32; keys no row sees (bit t of `seen` clear, and those past the block's
 * n) are zeros. */
static void copy_block(const AttnJob *j, Py_ssize_t g, Py_ssize_t s0, uint64_t seen, float *kt,
                       float *vb) {
    const Py_ssize_t D = j->D;
    float row[ATTN_MAX_DIM];
    for (Py_ssize_t t = 0; t < ATTN_BLOCK; t++) {
        if (!(seen >> t & 1)) {
            for (Py_ssize_t d = 0; d < D; d++) kt[d * ATTN_BLOCK + t] = 0.f;
            memset(vb + t * D, 0, (size_t)D * sizeof(float));
            continue;
        }
        const float *k = kv_row(j, 0, g, s0 + t, row);
        for (Py_ssize_t d = 0; d < D; d++) kt[d * ATTN_BLOCK + t] = k[d];
        const float *v = kv_row(j, 1, g, s0 + t, vb + t * D);
        if (v != vb + t * D) memcpy(vb + t * D, v, (size_t)D * sizeof(float));
    }
}

/* sc[r][0, 64) = scale * q[r] . k_t for a quad of rows (the block's keys in kt). */
static inline void score_quad(const float *const *q, const float *kt, Py_ssize_t D,
                              float scale, float (*sc)[ATTN_BLOCK]) {
    __m512 a[QUAD][4];
    for (int r = 0; r < QUAD; r++)
        for (int t = 0; t < 4; t++) a[r][t] = _mm512_setzero_ps();
    for (Py_ssize_t d = 0; d < D; d++) {
        const float *kd = kt + d * ATTN_BLOCK;
        const __m512 k0 = _mm512_load_ps(kd), k1 = _mm512_load_ps(kd + 16);
        const __m512 k2 = _mm512_load_ps(kd + 32), k3 = _mm512_load_ps(kd + 48);
        for (int r = 0; r < QUAD; r++) {
            const __m512 qd = _mm512_set1_ps(q[r][d]);
            a[r][0] = _mm512_fmadd_ps(qd, k0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(qd, k1, a[r][1]);
            a[r][2] = _mm512_fmadd_ps(qd, k2, a[r][2]);
            a[r][3] = _mm512_fmadd_ps(qd, k3, a[r][3]);
        }
    }
    const __m512 s = _mm512_set1_ps(scale);
    for (int r = 0; r < QUAD; r++)
        for (int t = 0; t < 4; t++) _mm512_store_ps(sc[r] + 16 * t, _mm512_mul_ps(a[r][t], s));
}

/* acc[r][d0, d0 + 64) = alpha[r] acc[r][d0, d0 + 64) + sum_t p[r][t] vb[t][d0, d0 + 64)
 * for a quad of rows; alpha 0 starts a partial (its acc is not read). */
static inline void pv_quad(float (*p)[ATTN_BLOCK], const float *vb, Py_ssize_t D,
                           Py_ssize_t n, Py_ssize_t d0, float *const *acc, const float *alpha) {
    __m512 a[QUAD][4];
    for (int r = 0; r < QUAD; r++) {
        const __m512 scale = _mm512_set1_ps(alpha[r]);
        for (int c = 0; c < 4; c++)
            a[r][c] = alpha[r] == 0.f ? _mm512_setzero_ps()
                                      : _mm512_mul_ps(scale, _mm512_loadu_ps(acc[r] + d0 + 16 * c));
    }
    for (Py_ssize_t t = 0; t < n; t++) {
        const float *v = vb + t * D + d0;
        const __m512 v0 = _mm512_load_ps(v), v1 = _mm512_load_ps(v + 16);
        const __m512 v2 = _mm512_load_ps(v + 32), v3 = _mm512_load_ps(v + 48);
        for (int r = 0; r < QUAD; r++) {
            const __m512 pt = _mm512_set1_ps(p[r][t]);
            a[r][0] = _mm512_fmadd_ps(pt, v0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(pt, v1, a[r][1]);
            a[r][2] = _mm512_fmadd_ps(pt, v2, a[r][2]);
            a[r][3] = _mm512_fmadd_ps(pt, v3, a[r][3]);
        }
    }
    for (int r = 0; r < QUAD; r++)
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc[r] + d0 + 16 * c, a[r][c]);
}

/* Which of keys [s0, s0 + n) row R sees: bit t for key s0 + t. */
static inline uint64_t visible_keys(const AttnRun *run, Py_ssize_t R, Py_ssize_t s0,
                                    uint64_t in_block) {
    const uint8_t *mask = mask_row(run, R);
    if (!mask) return in_block;
    const __m512i bytes = _mm512_maskz_loadu_epi8(in_block, mask + s0);
    return _mm512_test_epi8_mask(bytes, bytes);
}

/* Rows [R0, R0 + num_rows) over the block in kt/vb (keys [s0, s0 + n)), folded into
 * partial p of each row; `first`: the span's first block, which starts the partials. */
static void block_rows(const AttnRun *run, const float *kt, const float *vb, Py_ssize_t s0,
                       Py_ssize_t n, Py_ssize_t R0, Py_ssize_t num_rows, Py_ssize_t p,
                       int first) {
    const AttnJob *j = run->job;
    const Py_ssize_t D = j->D, nb = run->num_blocks, num_tiles = (n + 15) / 16;
    const uint64_t in_block = n == 64 ? ~0ull : (1ull << n) - 1;
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    _Alignas(64) float sc[QUAD][ATTN_BLOCK];
    _Alignas(64) float spare[ATTN_PREFILL_DIM]; /* dead and padded rows of a quad write here */
    for (Py_ssize_t r0 = 0; r0 < num_rows; r0 += QUAD) {
        const float *q[QUAD];
        float *acc[QUAD], alpha[QUAD];
        uint64_t visible[QUAD];
        for (int r = 0; r < QUAD; r++) {
            const Py_ssize_t R = R0 + (r0 + r < num_rows ? r0 + r : num_rows - 1);
            const Py_ssize_t at = R * nb + p;
            q[r] = q_row(run, R);
            visible[r] = r0 + r < num_rows ? visible_keys(run, R, s0, in_block) : 0;
            if (first && r0 + r < num_rows) { /* an empty partial, until a block the row sees */
                run->m[at] = -INFINITY;
                run->sum[at] = 0.f;
            }
            acc[r] = visible[r] ? run->acc + at * D : spare;
            alpha[r] = 0.f;
        }
        if (!(visible[0] | visible[1] | visible[2] | visible[3])) continue;
        score_quad(q, kt, D, j->scale, sc);
        for (int r = 0; r < QUAD; r++) {
            if (!visible[r]) { /* a dead or padded row weighs nothing */
                memset(sc[r], 0, sizeof sc[r]);
                continue;
            }
            for (Py_ssize_t t = 0; t < num_tiles; t++)
                _mm512_store_ps(sc[r] + 16 * t,
                                _mm512_mask_mov_ps(neg_inf, (__mmask16)(visible[r] >> 16 * t),
                                                   _mm512_load_ps(sc[r] + 16 * t)));
            const Py_ssize_t at = (R0 + r0 + r) * nb + p;
            const float m_old = run->m[at];
            const float block_sum = softmax_tiles(sc[r], num_tiles, run->m + at);
            alpha[r] = m_old == -INFINITY ? 0.f : expf(m_old - run->m[at]);
            run->sum[at] = run->sum[at] * alpha[r] + block_sum;
        }
        for (Py_ssize_t d0 = 0; d0 < D; d0 += 64) pv_quad(sc, vb, D, n, d0, acc, alpha);
    }
}

void span_prefill(const AttnRun *run, Py_ssize_t g, Py_ssize_t p, Py_ssize_t R0,
                  Py_ssize_t num_rows) {
    const AttnJob *j = run->job;
    _Alignas(64) float kt[ATTN_PREFILL_DIM * ATTN_BLOCK], vb[ATTN_BLOCK * ATTN_PREFILL_DIM];
    const Py_ssize_t num_kb = (j->S + ATTN_BLOCK - 1) / ATTN_BLOCK;
    const Py_ssize_t b0 = run->first_block + p * run->span;
    const Py_ssize_t b1 = b0 + run->span < num_kb ? b0 + run->span : num_kb;
    for (Py_ssize_t kb = b0; kb < b1; kb++) {
        const Py_ssize_t s0 = kb * ATTN_BLOCK, n = j->S - s0 < ATTN_BLOCK ? j->S - s0 : ATTN_BLOCK;
        const uint64_t in_block = n == 64 ? ~0ull : (1ull << n) - 1;
        uint64_t seen = 0;
        for (Py_ssize_t R = R0; R < R0 + num_rows && seen != in_block; R++)
            seen |= visible_keys(run, R, s0, in_block);
        if (!seen && kb != b0) continue; /* no row sees the block (the first starts partials) */
        if (seen) copy_block(j, g, s0, seen, kt, vb);
        block_rows(run, kt, vb, s0, n, R0, num_rows, p, kb == b0); /* converted once for all */
    }
}
#endif
