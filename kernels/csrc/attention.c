/* Softmax attention over the KV cache's rows, float16 or float32, read in place:
 *   out[h, l] = softmax(scale * q[h, l] . k[h / G, :S]^T, masked) @ v[h / G, :S]
 *
 * Split-K ("flash-decoding", Dao et al. 2023): the keys fall into blocks of ATTN_BLOCK, and
 * one unit of work is (kv head, key block), so both cores share even Gemma 3's single kv
 * head. A unit scores all G * L query rows of its kv head against each key it loads
 * (GQA), and leaves per row a partial softmax: the block's max m_b, its sum l_b =
 * sum_j exp(s_j - m_b) and acc_b = sum_j exp(s_j - m_b) v_j. A second pass merges a row's
 * blocks in block order (Milakov & Gimelshein 2018, online softmax):
 *   out = sum_b exp(m_b - M) acc_b / sum_b exp(m_b - M) l_b,  M = max_b m_b.
 * The blocks are a fixed number of keys from key 0 and each row is summed alone, so a row's
 * result depends neither on the thread count nor on which other rows came (a verify row
 * equals its decode step bit for bit) on a code path: AVX-512 tiles (head dims a multiple
 * of 16), AVX2 tiles (of 8), else portable C. Masked keys are skipped, never weighted by 0
 * (a ring's unwritten rows may hold anything), and a block no row sees is not read. Past
 * ATTN_MANY_ROWS rows per head (a prefill chunk) attention_prefill.c's tiles take over.
 * A sliding window's ring is read the same way, its keys by position (block b: positions
 * [64 b, 64 b + 64), from the slots or the call's own rows), from the block of the first
 * key any row sees: a row meets the same blocks whatever rows come with it. */
#include "attention.h"

#include <stdlib.h>

/* -- portable C ------------------------------------------------------------------------ */

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

/* One row's partial over keys [s0, s0 + n) of kv head g. */
static void block_row_portable(const AttnRun *run, Py_ssize_t g, Py_ssize_t s0, Py_ssize_t n,
                               Py_ssize_t R, Py_ssize_t at) {
    const AttnJob *j = run->job;
    const Py_ssize_t D = j->D;
    const float *q = q_row(run, R);
    const uint8_t *mask = mask_row(run, R);
    float sc[ATTN_BLOCK], row[ATTN_MAX_DIM], m = -INFINITY;
    for (Py_ssize_t t = 0; t < n; t++) {
        sc[t] = -INFINITY;
        if (mask && !mask[s0 + t]) continue;
        sc[t] = attn_dot(q, kv_row(j, 0, g, s0 + t, row), D) * j->scale;
        if (sc[t] > m) m = sc[t];
    }
    float *acc = run->acc + at * D, total = 0.f;
    memset(acc, 0, (size_t)D * sizeof(float));
    for (Py_ssize_t t = 0; t < n; t++) {
        if (sc[t] == -INFINITY) continue;
        const float p = expf(sc[t] - m);
        total += p;
        const float *restrict vr = kv_row(j, 1, g, s0 + t, row);
        for (Py_ssize_t d = 0; d < D; d++) acc[d] += p * vr[d];
    }
    run->m[at] = m;
    run->sum[at] = total;
}

/* -- AVX-512 --------------------------------------------------------------------------- */
#if ATTN_AVX512

/* Lane i of the result: the sum of a[i]'s 16 lanes (a transpose in four halvings, then
 * one permute back to key order). Each key's lanes are summed in the same order. */
static inline __m512 sum16(__m512 *a) {
    __m512 x[8], y[4], z[2];
    for (int i = 0; i < 8; i++) /* 256-bit halves: keys 2i, 2i+1 */
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xee));
    for (int i = 0; i < 4; i++) /* 128-bit lane c: key 4i + c */
        y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xdd));
    for (int i = 0; i < 2; i++) /* lane c: keys c, c + 4 (i = 0) or c + 8, c + 12, twice */
        z[i] = _mm512_add_ps(_mm512_unpacklo_ps(y[2 * i], y[2 * i + 1]),
                             _mm512_unpackhi_ps(y[2 * i], y[2 * i + 1]));
    const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x44),
                                   _mm512_shuffle_ps(z[0], z[1], 0xee));
    /* element 4c + t of w holds key c + 4t */
    const __m512i order =
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, w);
}

/* q . k for the 16 keys of a tile (D a multiple of 16). */
static inline __m512 scores16(const float *q, const float *const *k, Py_ssize_t D) {
    __m512 a[ATTN_TILE];
    for (int i = 0; i < ATTN_TILE; i++) a[i] = _mm512_setzero_ps();
    for (Py_ssize_t d = 0; d < D; d += 16) {
        const __m512 qv = _mm512_loadu_ps(q + d);
        for (int i = 0; i < ATTN_TILE; i++)
            a[i] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k[i] + d), a[i]);
    }
    return sum16(a);
}

/* scores16 for two rows at once, each key's vector loaded once for both (half the loads
 * per FMA): the same sums, key by key, as scores16 gives each row alone. */
static inline void scores16_pair(const float *q0, const float *q1, const float *const *k,
                                 Py_ssize_t D, __m512 *s0, __m512 *s1) {
    __m512 a0[ATTN_TILE], a1[ATTN_TILE];
    for (int h = 0; h < ATTN_TILE; h += 8) { /* 8 keys x 2 rows: 16 accumulators */
        __m512 x0[8], x1[8];
        for (int i = 0; i < 8; i++) x0[i] = x1[i] = _mm512_setzero_ps();
        for (Py_ssize_t d = 0; d < D; d += 16) {
            const __m512 qa = _mm512_loadu_ps(q0 + d), qb = _mm512_loadu_ps(q1 + d);
            for (int i = 0; i < 8; i++) {
                const __m512 kv = _mm512_loadu_ps(k[h + i] + d);
                x0[i] = _mm512_fmadd_ps(qa, kv, x0[i]);
                x1[i] = _mm512_fmadd_ps(qb, kv, x1[i]);
            }
        }
        for (int i = 0; i < 8; i++) a0[h + i] = x0[i], a1[h + i] = x1[i];
    }
    *s0 = sum16(a0);
    *s1 = sum16(a1);
}

/* acc[0, 16 NV) += sum over the set bits i of `live` of p[i] v[i][0, 16 NV): a row's
 * accumulators stay in registers across the tile, in two sets (even and odd keys taken)
 * so that consecutive keys' FMAs do not wait on each other. */
#define PV_TILE(NV)                                                                         \
    static inline void pv_tile_##NV(float *acc, const float *p, const float *const *v,     \
                                    Py_ssize_t d0, unsigned live) {                         \
        __m512 a[NV], b[NV];                                                                \
        for (int c = 0; c < NV; c++) {                                                      \
            a[c] = _mm512_loadu_ps(acc + 16 * c);                                           \
            b[c] = _mm512_setzero_ps();                                                     \
        }                                                                                   \
        if (live == 0xffffu) { /* every key weighted: no bit scan */                        \
            for (int i = 0; i < ATTN_TILE; i += 2) {                                        \
                const __m512 p0 = _mm512_set1_ps(p[i]), p1 = _mm512_set1_ps(p[i + 1]);      \
                for (int c = 0; c < NV; c++) {                                              \
                    a[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v[i] + d0 + 16 * c), a[c]);  \
                    b[c] = _mm512_fmadd_ps(p1, _mm512_loadu_ps(v[i + 1] + d0 + 16 * c), b[c]); \
                }                                                                           \
            }                                                                               \
            live = 0;                                                                       \
        }                                                                                   \
        while (live) {                                                                      \
            const int i = __builtin_ctz(live);                                              \
            live &= live - 1;                                                               \
            const __m512 pi = _mm512_set1_ps(p[i]);                                         \
            for (int c = 0; c < NV; c++)                                                    \
                a[c] = _mm512_fmadd_ps(pi, _mm512_loadu_ps(v[i] + d0 + 16 * c), a[c]);      \
            if (!live) break;                                                               \
            const int i2 = __builtin_ctz(live);                                             \
            live &= live - 1;                                                               \
            const __m512 p2 = _mm512_set1_ps(p[i2]);                                        \
            for (int c = 0; c < NV; c++)                                                    \
                b[c] = _mm512_fmadd_ps(p2, _mm512_loadu_ps(v[i2] + d0 + 16 * c), b[c]);     \
        }                                                                                   \
        for (int c = 0; c < NV; c++) _mm512_storeu_ps(acc + 16 * c, _mm512_add_ps(a[c], b[c])); \
    }
PV_TILE(8)
PV_TILE(4)
PV_TILE(1)

/* pv_tile for two rows that weight all 16 keys (most of a prefill piece's tiles), 64 or
 * 16 dims at a time: each row's sums as pv_tile forms them (even keys into acc, odd ones
 * apart, then added), each V vector loaded once for both. */
#define PV_PAIR(NV)                                                                           \
    static inline void pv_pair_##NV(float *acc0, float *acc1, const float *p0, const float *p1, \
                                    const float *const *v, Py_ssize_t d0) {                   \
        __m512 a0[NV], b0[NV], a1[NV], b1[NV];                                                \
        for (int c = 0; c < NV; c++) {                                                        \
            a0[c] = _mm512_loadu_ps(acc0 + 16 * c), a1[c] = _mm512_loadu_ps(acc1 + 16 * c);   \
            b0[c] = b1[c] = _mm512_setzero_ps();                                              \
        }                                                                                     \
        for (int i = 0; i < ATTN_TILE; i += 2) {                                              \
            const __m512 e0 = _mm512_set1_ps(p0[i]), e1 = _mm512_set1_ps(p1[i]);              \
            const __m512 o0 = _mm512_set1_ps(p0[i + 1]), o1 = _mm512_set1_ps(p1[i + 1]);      \
            for (int c = 0; c < NV; c++) {                                                    \
                const __m512 ve = _mm512_loadu_ps(v[i] + d0 + 16 * c);                        \
                const __m512 vo = _mm512_loadu_ps(v[i + 1] + d0 + 16 * c);                    \
                a0[c] = _mm512_fmadd_ps(e0, ve, a0[c]), a1[c] = _mm512_fmadd_ps(e1, ve, a1[c]); \
                b0[c] = _mm512_fmadd_ps(o0, vo, b0[c]), b1[c] = _mm512_fmadd_ps(o1, vo, b1[c]); \
            }                                                                                 \
        }                                                                                     \
        for (int c = 0; c < NV; c++) {                                                        \
            _mm512_storeu_ps(acc0 + 16 * c, _mm512_add_ps(a0[c], b0[c]));                     \
            _mm512_storeu_ps(acc1 + 16 * c, _mm512_add_ps(a1[c], b1[c]));                     \
        }                                                                                     \
    }
PV_PAIR(4)
PV_PAIR(1)

/* acc[0, D) += the tile's p-weighted V rows, in chunks of 128, 64 and 16 dims. */
static inline void pv_tile(float *acc, const float *p, const float *const *v, Py_ssize_t D,
                           unsigned live) {
    Py_ssize_t d = 0;
    for (; d + 128 <= D; d += 128) pv_tile_8(acc + d, p, v, d, live);
    for (; d + 64 <= D; d += 64) pv_tile_4(acc + d, p, v, d, live);
    for (; d < D; d += 16) pv_tile_1(acc + d, p, v, d, live);
}

/* The tile's rows of K or V as float32: pointers into the cache, or into buf (float16).
 * A tile past the last key repeats a loaded row (its scores are discarded). */
static inline void tile_rows(const AttnJob *j, int is_v, Py_ssize_t g, Py_ssize_t s0,
                             Py_ssize_t n, float *buf, const float **rows) {
    for (Py_ssize_t i = 0; i < ATTN_TILE; i++)
        rows[i] = i < n ? kv_row(j, is_v, g, s0 + i, buf + i * j->D) : rows[0];
}

/* Partials of rows [R0, R0 + num_rows) of kv head g over keys [s0, s0 + n). */
static void block_rows_avx512(const AttnRun *run, Py_ssize_t g, Py_ssize_t s0, Py_ssize_t n,
                              Py_ssize_t R0, Py_ssize_t num_rows, Py_ssize_t b) {
    const AttnJob *j = run->job;
    const Py_ssize_t D = j->D, nb = run->num_blocks;
    _Alignas(64) float sc[ATTN_ROWS][ATTN_BLOCK];
    _Alignas(64) float buf[ATTN_TILE * ATTN_MAX_DIM];
    const float *rows[ATTN_TILE], *q[ATTN_ROWS];
    const uint8_t *masks[ATTN_ROWS];
    int live[ATTN_ROWS];
    const int num_live = block_rows_setup(run, s0, n, R0, num_rows, b, q, masks, live);
    if (!num_live) return;
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), scale = _mm512_set1_ps(j->scale);
    int order[ATTN_ROWS]; /* the live rows, taken in pairs */
    for (int r = 0, i = 0; r < num_rows; r++)
        if (live[r]) order[i++] = r;
    for (Py_ssize_t t0 = 0; t0 < n; t0 += ATTN_TILE) {
        const Py_ssize_t nt = n - t0 < ATTN_TILE ? n - t0 : ATTN_TILE;
        const __mmask16 in_range = (__mmask16)((1u << nt) - 1);
        tile_rows(j, 0, g, s0 + t0, nt, buf, rows);
        for (int i = 0; i < num_live; i += 2) {
            const int pair = i + 1 < num_live, r0 = order[i], r1 = order[i + pair];
            __m512 s[2];
            if (pair)
                scores16_pair(q[r0], q[r1], rows, D, &s[0], &s[1]);
            else
                s[0] = scores16(q[r0], rows, D);
            for (int t = 0; t <= pair; t++) {
                const int r = t ? r1 : r0;
                __mmask16 visible = in_range;
                if (masks[r])
                    visible = _mm_mask_test_epi8_mask(
                        in_range, _mm_maskz_loadu_epi8(in_range, masks[r] + s0 + t0),
                        _mm_set1_epi8((char)0xff));
                _mm512_store_ps(sc[r] + t0, _mm512_mask_mov_ps(neg_inf, visible,
                                                               _mm512_mul_ps(s[t], scale)));
            }
        }
    }
    const Py_ssize_t num_tiles = (n + ATTN_TILE - 1) / ATTN_TILE;
    for (Py_ssize_t r = 0; r < num_rows; r++) {
        if (!live[r]) continue;
        const Py_ssize_t at = (R0 + r) * nb + b;
        run->m[at] = -INFINITY;
        run->sum[at] = softmax_tiles(sc[r], num_tiles, run->m + at);
        memset(run->acc + at * D, 0, (size_t)D * sizeof(float));
    }
    for (Py_ssize_t t0 = 0; t0 < n; t0 += ATTN_TILE) {
        const Py_ssize_t nt = n - t0 < ATTN_TILE ? n - t0 : ATTN_TILE;
        tile_rows(j, 1, g, s0 + t0, nt, buf, rows);
        int held = -1; /* a row weighting every key, waiting for another */
        for (int i = 0; i < num_live; i++) {
            const int r = order[i];
            const float *p = sc[r] + t0;
            float *acc = run->acc + ((R0 + r) * nb + b) * D;
            /* keys it sees with a nonzero weight (a masked key's row may hold anything) */
            const unsigned weighted = _mm512_cmp_ps_mask(_mm512_load_ps(p), _mm512_setzero_ps(),
                                                         _CMP_NEQ_OQ) & ((1u << nt) - 1);
            if (weighted != 0xffffu) {
                pv_tile(acc, p, rows, D, weighted);
            } else if (held < 0) {
                held = r;
            } else {
                float *acc0 = run->acc + ((R0 + held) * nb + b) * D;
                const float *p0 = sc[held] + t0;
                Py_ssize_t d = 0;
                for (; d + 64 <= D; d += 64) pv_pair_4(acc0 + d, acc + d, p0, p, rows, d);
                for (; d < D; d += 16) pv_pair_1(acc0 + d, acc + d, p0, p, rows, d);
                held = -1;
            }
        }
        if (held >= 0)
            pv_tile(run->acc + ((R0 + held) * nb + b) * D, sc[held] + t0, rows, D, 0xffffu);
    }
}
#endif

/* -- the two passes -------------------------------------------------------------------- */

/* Rows [R0, R0 + rows) of kv head g over key block b (decode tiles: not a prefill chunk's). */
static void block_unit(const AttnRun *run, Py_ssize_t g, Py_ssize_t b, Py_ssize_t R0,
                       Py_ssize_t rows) {
    const AttnJob *j = run->job;
    const Py_ssize_t s0 = (run->first_block + b) * ATTN_BLOCK;
    const Py_ssize_t n = j->S - s0 < ATTN_BLOCK ? j->S - s0 : ATTN_BLOCK;
    for (Py_ssize_t r0 = 0; r0 < rows; r0 += ATTN_ROWS) {
        const Py_ssize_t num_rows = rows - r0 < ATTN_ROWS ? rows - r0 : ATTN_ROWS;
#if ATTN_AVX512
        if (run->simd) {
            block_rows_avx512(run, g, s0, n, R0 + r0, num_rows, b);
            continue;
        }
#endif
#if HAVE_AVX2
        if (run->avx2) {
            block_rows_avx2(run, g, s0, n, R0 + r0, num_rows, b);
            continue;
        }
#endif
        for (Py_ssize_t R = R0 + r0; R < R0 + r0 + num_rows; R++) {
            const Py_ssize_t at = R * run->num_blocks + b;
            if (any_visible(mask_row(run, R), s0, n))
                block_row_portable(run, g, s0, n, R, at);
            else
                run->m[at] = -INFINITY;
        }
    }
}

/* Unit (kv head g, partial b): the kv head's G * lc query rows over key block b, or over
 * the span of blocks of partial b for a prefill chunk. */
static void attention_block(const void *ctx, Py_ssize_t item) {
    const AttnRun *run = (const AttnRun *)ctx;
    const Py_ssize_t g = item / run->num_blocks, b = item % run->num_blocks;
    const Py_ssize_t rows = run->job->G * run->lc, R0 = g * rows;
#if ATTN_AVX512
    if (run->many) {
        span_prefill(run, g, b, R0, rows);
        return;
    }
#endif
    block_unit(run, g, b, R0, rows);
}

/* Row R: its blocks' partials merged in block order into out. */
static void attention_merge(const void *ctx, Py_ssize_t R) {
    const AttnRun *run = (const AttnRun *)ctx;
    const AttnJob *j = run->job;
    const Py_ssize_t nb = run->num_blocks, D = j->D, h = R / run->lc;
    const float *m = run->m + R * nb, *sum = run->sum + R * nb;
    float *restrict out = j->out + (h * j->L + run->l0 + R % run->lc) * D;
    float M = -INFINITY, total = 0.f;
    for (Py_ssize_t b = 0; b < nb; b++)
        if (m[b] > M) M = m[b];
    memset(out, 0, (size_t)D * sizeof(float));
    if (M == -INFINITY) return; /* no visible key: zeros */
    for (Py_ssize_t b = 0; b < nb; b++) {
        if (m[b] == -INFINITY) continue;
        const float w = expf(m[b] - M);
        const float *restrict acc = run->acc + (R * nb + b) * D;
        total += w * sum[b];
        for (Py_ssize_t d = 0; d < D; d++) out[d] += w * acc[d];
    }
    const float inv = 1.0f / total;
    for (Py_ssize_t d = 0; d < D; d++) out[d] *= inv;
}

/* Unit (kv head g, group of ATTN_GROUP_ROWS of its rows): every key block for those rows,
 * then their merges: one pass over the pool where a verify's few blocks would leave the
 * two passes' units short and the threads waiting between them (an 8-row verify of the
 * default model at context 128: 9 units of blocks, 72 of merges). A row's partials and
 * merge are the two passes' own, so its bits are too. */
static void attention_rows(const void *ctx, Py_ssize_t item) {
    const AttnRun *run = (const AttnRun *)ctx;
    const Py_ssize_t rows = run->job->G * run->lc;
    const Py_ssize_t groups = (rows + ATTN_GROUP_ROWS - 1) / ATTN_GROUP_ROWS;
    const Py_ssize_t g = item / groups, R0 = g * rows + item % groups * ATTN_GROUP_ROWS;
    const Py_ssize_t last = (g + 1) * rows; /* the kv head's rows end here */
    const Py_ssize_t end = R0 + ATTN_GROUP_ROWS < last ? R0 + ATTN_GROUP_ROWS : last;
    for (Py_ssize_t b = 0; b < run->num_blocks; b++) block_unit(run, g, b, R0, end - R0);
    for (Py_ssize_t R = R0; R < end; R++) attention_merge(run, R);
}

int run_attention(const AttnJob *job, Py_ssize_t Hq, Py_ssize_t L) {
    const Py_ssize_t S = job->S, D = job->D;
    if (Hq * L == 0) return 0;
    if (S == 0) {
        memset(job->out, 0, (size_t)(Hq * L * D) * sizeof(float));
        return 0;
    }
    const Py_ssize_t Hkv = Hq / job->G, first_block = job->key_lo / ATTN_BLOCK;
    const Py_ssize_t num_kb = (S + ATTN_BLOCK - 1) / ATTN_BLOCK - first_block;
    const Py_ssize_t num_keys = S - first_block * ATTN_BLOCK; /* the keys a pass reads */
    const int simd = isa == ISA_AVX512 && D % 16 == 0;
    const int many = simd && L > ATTN_MANY_ROWS && D % 64 == 0 && D <= ATTN_PREFILL_DIM;
    /* a prefill chunk: spans of blocks, still ~8 units of work per call for the pool (a
     * span depends on S, key_lo and Hkv only, never on the thread count) */
    Py_ssize_t span = many ? num_kb * Hkv / 8 : 1;
    span = span < 1 ? 1 : span > ATTN_PREFILL_SPAN ? ATTN_PREFILL_SPAN : span;
    const Py_ssize_t nb = (num_kb + span - 1) / span;
    const Py_ssize_t chunk = many ? ATTN_CHUNK_L_PREFILL : ATTN_CHUNK_L;
    const Py_ssize_t lc_max = L < chunk ? L : chunk;
    const size_t partials = (size_t)(Hq * lc_max * nb);
    float *m = alloc_aligned(partials * sizeof(float));
    float *sum = alloc_aligned(partials * sizeof(float));
    float *acc = alloc_aligned(partials * (size_t)D * sizeof(float));
    if (!m || !sum || !acc) {
        free_aligned(m);
        free_aligned(sum);
        free_aligned(acc);
        return -1;
    }
    AttnRun run = {.job = job, .first_block = first_block, .num_blocks = nb, .span = span,
                   .m = m, .sum = sum, .acc = acc, .simd = simd, .many = many};
    run.avx2 = !simd && (isa == ISA_AVX2 || isa == ISA_AVX512) && D % 8 == 0;
    /* workers poll after a decode or verify call (a packed matmul follows within
     * microseconds), not after a prefill chunk's: BLAS's threads want the cores next */
    const long long spin = L > ATTN_MANY_ROWS ? 0 : SPIN_NS;
    for (run.l0 = 0; run.l0 < L; run.l0 += run.lc) {
        run.lc = L - run.l0 < lc_max ? L - run.l0 : lc_max;
        const Py_ssize_t rows = job->G * run.lc;
        const Py_ssize_t groups = (rows + ATTN_GROUP_ROWS - 1) / ATTN_GROUP_ROWS;
        if (Hq * run.lc * num_keys < ATTN_PARALLEL_KEYS) {
            /* a short context: waking a worker costs more than it saves */
            for (Py_ssize_t i = 0; i < Hkv * nb; i++) attention_block(&run, i);
            for (Py_ssize_t R = 0; R < Hq * run.lc; R++) attention_merge(&run, R);
        } else if (!many && nb <= ATTN_GROUP_BLOCKS && groups >= 2) {
            parallel_for(attention_rows, &run, Hkv * groups, spin);
        } else {
            parallel_for(attention_block, &run, Hkv * nb, SPIN_NS);
            parallel_for(attention_merge, &run, Hq * run.lc, spin);
        }
    }
    free_aligned(m);
    free_aligned(sum);
    free_aligned(acc);
    return 0;
}

int run_ring_attention(AttnJob *job, const int64_t *positions, Py_ssize_t window,
                       uint8_t *mask, Py_ssize_t Hq) {
    const Py_ssize_t S = job->S, first_new = job->first_new, size = job->ring_rows;
    job->key_lo = first_new - window + 1 > 0 ? first_new - window + 1 : 0;
    for (Py_ssize_t l = 0; l < job->L; l++) { /* only key_lo's block on is read */
        const Py_ssize_t pos = first_new + l;
        uint8_t *row = mask + l * S;
        for (Py_ssize_t s = job->key_lo / ATTN_BLOCK * ATTN_BLOCK; s < S; s++)
            row[s] = s <= pos && s > pos - window && (s >= first_new || positions[s % size] == s);
    }
    job->mask = mask;
    return run_attention(job, Hq, job->L);
}
