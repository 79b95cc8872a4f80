/* The AVX2 (+ FMA, F16C) tiles of attention for decode and verify rows: attention.c's
 * AVX-512 decode tiles at half the width, for CPUs without AVX-512 (and the `avx2` code
 * path here). A tile is 8 keys: converted once (float16) for all G * L rows of the kv
 * head, scored by one transposed reduction per row, then weighted into P V with each
 * row's accumulators in registers. Masked keys are skipped, never weighted by 0. */
#include "attention.h"

#if HAVE_AVX2

#define TILE 8 /* keys per tile: one AVX2 register of scores */

/* e^x for x <= 0 (attention.h's exp512 at 8 lanes); 2^n is built in the exponent bits,
 * so x is clamped at -87 (e^-87 ~ 1.6e-38, the smallest normal float's order). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Lane i: the sum of a[i]'s 8 lanes, each key's in the same order. */
static inline __m256 sum8(const __m256 *a) {
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

/* q . k for the 8 keys of a tile (D a multiple of 8). */
static inline __m256 scores8(const float *q, const float *const *k, Py_ssize_t D) {
    __m256 a[TILE];
    for (int i = 0; i < TILE; i++) a[i] = _mm256_setzero_ps();
    for (Py_ssize_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        for (int i = 0; i < TILE; i++) a[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[i] + d), a[i]);
    }
    return sum8(a);
}

/* acc[0, D) += sum over the set bits i of `live` of p[i] v[i]: 32 dims at a time in two
 * register sets (alternate keys), so consecutive keys' FMAs do not wait on each other. */
static inline void pv_tile(float *acc, const float *p, const float *const *v, Py_ssize_t D,
                           unsigned live) {
    for (Py_ssize_t d0 = 0; d0 < D; d0 += 32) {
        const int nv = D - d0 < 32 ? (int)(D - d0) / 8 : 4;
        __m256 a[4], b[4];
        for (int c = 0; c < nv; c++) {
            a[c] = _mm256_loadu_ps(acc + d0 + 8 * c);
            b[c] = _mm256_setzero_ps();
        }
        for (unsigned rest = live; rest;) {
            const int i = __builtin_ctz(rest);
            rest &= rest - 1;
            const __m256 pi = _mm256_set1_ps(p[i]);
            for (int c = 0; c < nv; c++)
                a[c] = _mm256_fmadd_ps(pi, _mm256_loadu_ps(v[i] + d0 + 8 * c), a[c]);
            if (!rest) break;
            const int i2 = __builtin_ctz(rest);
            rest &= rest - 1;
            const __m256 p2 = _mm256_set1_ps(p[i2]);
            for (int c = 0; c < nv; c++)
                b[c] = _mm256_fmadd_ps(p2, _mm256_loadu_ps(v[i2] + d0 + 8 * c), b[c]);
        }
        for (int c = 0; c < nv; c++) _mm256_storeu_ps(acc + d0 + 8 * c, _mm256_add_ps(a[c], b[c]));
    }
}

/* The tile's rows of K or V as float32 (pointers into the cache, or into buf); a tile past
 * the last key repeats a loaded row (its scores are discarded). */
static inline void tile_rows(const AttnJob *j, int is_v, Py_ssize_t g, Py_ssize_t s0,
                             Py_ssize_t n, float *buf, const float **rows) {
    for (Py_ssize_t i = 0; i < TILE; i++)
        rows[i] = i < n ? kv_row(j, is_v, g, s0 + i, buf + i * j->D) : rows[0];
}

/* A row's block of scores (masked keys -inf, at least one not) into exp(s - m) in place;
 * m the block's max, returns the sum. */
static inline float softmax8(float *sc, Py_ssize_t num_tiles, float *m_out) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    __m256 mv = neg_inf, total = _mm256_setzero_ps();
    for (Py_ssize_t t = 0; t < num_tiles; t++) mv = _mm256_max_ps(mv, _mm256_load_ps(sc + 8 * t));
    _Alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mv);
    float m = lanes[0];
    for (int i = 1; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
    mv = _mm256_set1_ps(m);
    for (Py_ssize_t t = 0; t < num_tiles; t++) {
        const __m256 s = _mm256_load_ps(sc + 8 * t);
        const __m256 seen = _mm256_cmp_ps(s, neg_inf, _CMP_NEQ_OQ);
        const __m256 p = _mm256_and_ps(seen, exp256(_mm256_sub_ps(s, mv)));
        total = _mm256_add_ps(total, p);
        _mm256_store_ps(sc + 8 * t, p);
    }
    _mm256_store_ps(lanes, total);
    float sum = 0.f;
    for (int i = 0; i < 8; i++) sum += lanes[i];
    *m_out = m;
    return sum;
}

void block_rows_avx2(const AttnRun *run, Py_ssize_t g, Py_ssize_t s0, Py_ssize_t n,
                     Py_ssize_t R0, Py_ssize_t num_rows, Py_ssize_t b) {
    const AttnJob *j = run->job;
    const Py_ssize_t D = j->D, nb = run->num_blocks, num_tiles = (n + TILE - 1) / TILE;
    _Alignas(32) float sc[ATTN_ROWS][ATTN_BLOCK];
    _Alignas(32) float buf[TILE * ATTN_MAX_DIM];
    const float *rows[TILE], *q[ATTN_ROWS];
    const uint8_t *masks[ATTN_ROWS];
    int live[ATTN_ROWS];
    if (!block_rows_setup(run, s0, n, R0, num_rows, b, q, masks, live)) return;
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY), scale = _mm256_set1_ps(j->scale);
    for (Py_ssize_t t0 = 0; t0 < n; t0 += TILE) {
        const Py_ssize_t nt = n - t0 < TILE ? n - t0 : TILE;
        tile_rows(j, 0, g, s0 + t0, nt, buf, rows);
        for (Py_ssize_t r = 0; r < num_rows; r++) {
            if (!live[r]) continue;
            uint8_t visible[TILE] = {0}; /* past the block's keys: masked */
            for (Py_ssize_t i = 0; i < nt; i++) visible[i] = !masks[r] || masks[r][s0 + t0 + i];
            const __m128i bytes = _mm_loadl_epi64((const __m128i *)visible);
            const __m256 hidden = _mm256_castsi256_ps(
                _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(bytes), _mm256_setzero_si256()));
            const __m256 s = _mm256_mul_ps(scores8(q[r], rows, D), scale);
            _mm256_store_ps(sc[r] + t0, _mm256_blendv_ps(s, neg_inf, hidden));
        }
    }
    for (Py_ssize_t r = 0; r < num_rows; r++) {
        if (!live[r]) continue;
        const Py_ssize_t at = (R0 + r) * nb + b;
        run->sum[at] = softmax8(sc[r], num_tiles, run->m + at);
        memset(run->acc + at * D, 0, (size_t)D * sizeof(float));
    }
    for (Py_ssize_t t0 = 0; t0 < n; t0 += TILE) {
        const Py_ssize_t nt = n - t0 < TILE ? n - t0 : TILE;
        tile_rows(j, 1, g, s0 + t0, nt, buf, rows);
        for (Py_ssize_t r = 0; r < num_rows; r++) {
            if (!live[r]) continue;
            const float *p = sc[r] + t0;
            /* keys it sees with a nonzero weight (a masked key's row may hold anything) */
            const unsigned weighted =
                (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_load_ps(p), _mm256_setzero_ps(),
                                                           _CMP_NEQ_OQ)) & ((1u << nt) - 1);
            pv_tile(run->acc + ((R0 + r) * nb + b) * D, p, rows, D, weighted);
        }
    }
}
#endif
