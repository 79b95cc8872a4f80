/* The AVX-512 tiles of attention for a prefill chunk's many query rows (L > ATTN_MANY_ROWS
 * per head; attention.c splits the work and merges the partials as for decode rows).
 *
 * With ~100 rows per kv head a key block is worth rearranging once: K goes transposed
 * ([D, 64 keys]), so a register tile scores 4 rows x 64 keys with one broadcast FMA per
 * element and no horizontal sums (decode's tiles spend ~3 shuffles a key on those), and
 * P V runs 4 rows x 64 dims per tile. Causal and window masks skip the blocks no row of
 * the chunk sees; keys no row sees are zeroed in the block copy, never weighted by 0. */
#include "attention.h"

#if ATTN_AVX512

#define QUAD 4 /* query rows per register tile */

/* The block's keys transposed into kt [D, ATTN_BLOCK] and its values into vb [ATTN_BLOCK,
 * D], both float32; keys past n and keys no row sees are zeros. */
static void copy_block(const AttnJob *j, Py_ssize_t g, Py_ssize_t s0, Py_ssize_t n,
                       const uint8_t *seen, float *kt, float *vb) {
    const Py_ssize_t D = j->D;
    float row[ATTN_MAX_DIM];
    for (Py_ssize_t t = 0; t < ATTN_BLOCK; t++) {
        if (t >= n || !seen[t]) {
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

/* acc[r][d0, d0 + 64) = sum_t p[r][t] vb[t][d0, d0 + 64) for a quad of rows. */
static inline void pv_quad(float (*p)[ATTN_BLOCK], const float *vb, Py_ssize_t D,
                           Py_ssize_t n, Py_ssize_t d0, float *const *acc) {
    __m512 a[QUAD][4];
    for (int r = 0; r < QUAD; r++)
        for (int c = 0; c < 4; c++) a[r][c] = _mm512_setzero_ps();
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

void block_rows_prefill(const AttnRun *run, Py_ssize_t g, Py_ssize_t s0, Py_ssize_t n,
                        Py_ssize_t R0, Py_ssize_t num_rows, Py_ssize_t b) {
    const AttnJob *j = run->job;
    const Py_ssize_t D = j->D, nb = run->num_blocks;
    _Alignas(64) float kt[ATTN_PREFILL_DIM * ATTN_BLOCK], vb[ATTN_BLOCK * ATTN_PREFILL_DIM];
    _Alignas(64) float sc[ATTN_PREFILL_ROWS + QUAD][ATTN_BLOCK];
    const float *q[ATTN_PREFILL_ROWS + QUAD];
    float *acc[ATTN_PREFILL_ROWS + QUAD];
    uint8_t seen[ATTN_BLOCK] = {0};
    int live[ATTN_PREFILL_ROWS];
    Py_ssize_t num_live = 0;
    for (Py_ssize_t r = 0; r < num_rows; r++) {
        const uint8_t *mask = mask_row(run, R0 + r);
        q[r] = q_row(run, R0 + r);
        acc[r] = run->acc + ((R0 + r) * nb + b) * D;
        live[r] = 0;
        for (Py_ssize_t t = 0; t < n; t++) {
            const int visible = !mask || mask[s0 + t];
            seen[t] |= (uint8_t)visible;
            live[r] |= visible;
        }
        num_live += live[r];
        if (!live[r]) run->m[(R0 + r) * nb + b] = -INFINITY;
    }
    if (!num_live) return;
    _Alignas(64) float spare[ATTN_PREFILL_DIM]; /* a padded quad's rows write here */
    for (Py_ssize_t r = num_rows; r < num_rows + QUAD; r++) {
        q[r] = q[num_rows - 1];
        acc[r] = spare;
    }
    copy_block(j, g, s0, n, seen, kt, vb);
    const Py_ssize_t num_tiles = (n + 15) / 16;
    for (Py_ssize_t r0 = 0; r0 < num_rows; r0 += QUAD) {
        score_quad(q + r0, kt, D, j->scale, sc + r0);
        for (Py_ssize_t r = r0; r < r0 + QUAD && r < num_rows; r++) {
            if (!live[r]) continue;
            const uint8_t *mask = mask_row(run, R0 + r);
            for (Py_ssize_t t = 0; t < num_tiles * 16; t++)
                if (t >= n || (mask && !mask[s0 + t])) sc[r][t] = -INFINITY;
            const Py_ssize_t at = (R0 + r) * nb + b;
            row_softmax(sc[r], num_tiles, run->m + at, run->sum + at);
        }
        for (Py_ssize_t r = r0; r < r0 + QUAD; r++) /* a dead or padded row weighs nothing */
            if (r >= num_rows || !live[r]) memset(sc[r], 0, sizeof sc[r]);
        for (Py_ssize_t d0 = 0; d0 < D; d0 += 64) pv_quad(sc + r0, vb, D, n, d0, acc + r0);
    }
}
#endif
