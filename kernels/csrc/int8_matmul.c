/* out[m, n] = x[m, k] @ W^T against the tiled integer layout of int8.h: x is quantized to
 * int8 blocks of 32 once per call, and each tile of 16 output rows sums q * xq in int32
 * (vpdpbusd: u8 weight x s8 activation, 4 products per lane, 16 rows per zmm, no
 * horizontal sums), then applies the float steps of int8.h in their fixed order (against
 * 8-bit weights x has a second level, the residual's, and each weight vector meets both).
 * Decode is bound by the weight bytes read, ~0.56 a weight at 4 bits against 4 for float32.
 *
 * Code paths, chosen at run time from what the CPU reports (each compiled for its own
 * target, so a BRANCHCHAT_PORTABLE_BUILD=1 build still uses VNNI): AVX-512 VNNI (zmm),
 * AVX-VNNI (ymm), AVX2 (vpmaddubsw + vpmaddwd: the weights' nibbles go in separately at
 * 8 bits, as u8 x s8 pairs would saturate int16), and portable C. The integer sums are
 * exact on every path and the float steps the same, so all agree with the reference
 * (kernels/int8_ref.py) to float32 rounding and a row never depends on m or threads.
 *
 * Work is split over runs of tiles (and, for many rows, panels of x that stay in L2 while
 * a run of tiles in L1 passes over them). Sections: portable C, AVX-512 VNNI, AVX2 and
 * AVX-VNNI, quantization, drivers.
 */
#include "int8.h"

#include <math.h>

#if defined(__x86_64__) || defined(__i386__)
#define I8_X86 1
#include <immintrin.h>
#else
#define I8_X86 0
#endif

const char *const I8_PATH_NAMES[I8_NUM_PATHS] = {"generic", "avx2", "avxvnni", "avx512vnni"};

/* x quantized: row r at xq + r * k, d + r * (k / 32), xb + r * groups; the second
 * level (8-bit weights) at xq2, d2 alike, else NULL */
typedef struct {
    const int8_t *xq;
    const float *d, *xb;
    const int8_t *xq2;
    const float *d2;
} I8X;

/* Weight bytes a tile's loop asks for ahead of its loads: the model's weights come from L3
 * (or memory) faster than the hardware prefetcher brings them (the default model's
 * matmuls of a decode step 3.9 -> 2.9 ms, of an 8-row verify 8.4 -> 6.0 ms, on AVX-512
 * VNNI; AVX2's decode 5.8 -> 3.7 ms; 512 bytes ahead gained a third of that, 4096 less
 * than 2048). Past a tile's end it reads into the next tile, past the matrix's into
 * nothing (a prefetch never faults). */
#define I8_PREFETCH 2048

/* rows [r0, r1) x tiles [t0, t1) of out */
typedef void (*I8BlockFn)(const I8Mat *w, const I8X *x, Py_ssize_t r0, Py_ssize_t r1,
                          Py_ssize_t t0, Py_ssize_t t1, float *out, Py_ssize_t ld);

static inline float i8_param(const I8Mat *w, const void *a, Py_ssize_t i) {
    return w->half ? half_to_float(((const uint16_t *)a)[i]) : ((const float *)a)[i];
}

/* -- portable C ------------------------------------------------------------------------- */

static void block_generic(const I8Mat *w, const I8X *x, Py_ssize_t r0, Py_ssize_t r1,
                          Py_ssize_t t0, Py_ssize_t t1, float *out, Py_ssize_t ld) {
    const Py_ssize_t k = w->k, groups = k / w->group_size;
    for (Py_ssize_t t = t0; t < t1; t++) {
        for (Py_ssize_t j = t * I8_TILE; j < (t + 1) * I8_TILE && j < w->n; j++) {
            const Py_ssize_t pbase = t * groups * I8_TILE + j % I8_TILE;
            for (Py_ssize_t r = r0; r < r1; r++) {
                const int8_t *xq = x->xq + r * k;
                const float *d = x->d + r * (k / I8_BLOCK), *xb = x->xb + r * groups;
                float acc_s = 0.0f, acc_b = 0.0f;
                for (Py_ssize_t g = 0; g < groups; g++) {
                    float tsum = 0.0f;
                    const Py_ssize_t end = (g + 1) * w->group_size;
                    for (Py_ssize_t e = g * w->group_size; e < end;) {
                        const Py_ssize_t b = e / I8_BLOCK;
                        const Py_ssize_t stop = (b + 1) * I8_BLOCK < end ? (b + 1) * I8_BLOCK : end;
                        int32_t isum = 0, isum2 = 0;
                        for (; e < stop; e++) {
                            isum += i8_q(w, j, e) * xq[e];
                            if (x->xq2) isum2 += i8_q(w, j, e) * x->xq2[r * k + e];
                        }
                        tsum = fmaf(d[b], (float)isum, tsum);
                        if (x->xq2) tsum = fmaf(x->d2[r * (k / I8_BLOCK) + b], (float)isum2, tsum);
                    }
                    acc_s = fmaf(i8_param(w, w->scales, pbase + g * I8_TILE), tsum, acc_s);
                    const float s = i8_param(w, w->scales, pbase + g * I8_TILE);
                    const float bias = w->zero ? s * (float)-w->zero
                                               : i8_param(w, w->biases, pbase + g * I8_TILE);
                    acc_b = fmaf(bias, xb[g], acc_b);
                }
                out[r * ld + j] = acc_s + acc_b;
            }
        }
    }
}

/* -- AVX-512 VNNI ----------------------------------------------------------------------- */
#if I8_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")

typedef int32_t __attribute__((may_alias, aligned(1))) I8Quad; /* 4 bytes of xq */

#define I8_MAX_MB 8 /* x rows per register tile */
#define I8_MAX_NT 4 /* tiles per register tile */

static inline __m512 params512(const I8Mat *w, const void *a, Py_ssize_t i) {
    return w->half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)a + i)))
                   : _mm512_loadu_ps((const float *)a + i);
}

/* acc + w . the quad at q broadcast, as vpdpbusd's embedded broadcast: GCC 12 loads
 * _mm512_set1_epi32(*q) with a separate vpbroadcastd, one more uop a dpbusd (the 8-bit
 * heads' 64-row pieces ran 171 -> 185 GMAC/s without it). */
static inline __attribute__((always_inline)) __m512i dpbusd_quad(__m512i acc, __m512i w,
                                                                 const I8Quad *q) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*q));
    return acc;
}

/* Weights of quads p and p + 1 of a tile: a nibble vector holds them as its low and high
 * nibbles; bits 5 and 6 add their planes' bits through byte masks. BITS 4 stands for 2,
 * 3 and 4. */
static inline __attribute__((always_inline)) void
weights512(const uint8_t *qs, const uint64_t *hb, Py_ssize_t quads, Py_ssize_t p, const int BITS,
           __m512i *lo, __m512i *hi) {
    if (BITS == 8) {
        *lo = _mm512_loadu_si512(qs + p * 64);
        *hi = _mm512_loadu_si512(qs + (p + 1) * 64);
        return;
    }
    const __m512i low4 = _mm512_set1_epi8(15), raw = _mm512_loadu_si512(qs + p / 2 * 64);
    *lo = _mm512_and_si512(raw, low4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
    if (BITS >= 5) {
        const __m512i b4 = _mm512_set1_epi8(16);
        *lo = _mm512_mask_add_epi8(*lo, _cvtu64_mask64(hb[p]), *lo, b4);
        *hi = _mm512_mask_add_epi8(*hi, _cvtu64_mask64(hb[p + 1]), *hi, b4);
    }
    if (BITS == 6) {
        const __m512i b5 = _mm512_set1_epi8(32);
        *lo = _mm512_mask_add_epi8(*lo, _cvtu64_mask64(hb[quads + p]), *lo, b5);
        *hi = _mm512_mask_add_epi8(*hi, _cvtu64_mask64(hb[quads + p + 1]), *hi, b5);
    }
}

/* NT tiles from t against MB rows of x from r: the int8.h arithmetic, one output a lane.
 * Every 512-bit op shares the two ports vpdpbusd runs on, so the shape is chosen to
 * spend the fewest other ops a dpbusd: each weight vector is unpacked once for all MB
 * rows, both quads of a nibble vector sum into one int32 accumulator (exact), and the
 * bias term (b * xb per group) runs after the integer pass, so only acc_s and the sums
 * hold registers while dpbusd runs (its float steps and their order are int8.h's).
 * Several tiles give a decode row independent dpbusd chains to overlap. GS: 16 or 32,
 * the group size (a group within one block: its t never outlives the block, and the
 * quads loop has a constant count); 0: any multiple of 32. BITS, NT, MB and GS are
 * constants at each use. */
static inline __attribute__((always_inline)) void
tile512(const I8Mat *w, const I8X *x, Py_ssize_t r, Py_ssize_t t, float *out, Py_ssize_t ld,
        const int BITS, const int NT, const int MB, const int GS) {
    const Py_ssize_t k = w->k, group_size = GS ? GS : w->group_size, quads = k / 4;
    const Py_ssize_t groups = k / group_size, portion = GS ? GS : I8_BLOCK;
    const Py_ssize_t portions = group_size / portion; /* blocks a group spans; 1 with GS */
    const uint8_t *qs[I8_MAX_NT];
    const uint64_t *hb[I8_MAX_NT];
    const int LEVELS = i8_levels(BITS);
    const I8Quad *xq[I8_MAX_MB], *xq2[I8_MAX_MB];
    const float *d[I8_MAX_MB], *d2[I8_MAX_MB], *xb[I8_MAX_MB];
    __m512 acc_s[I8_MAX_NT][I8_MAX_MB], acc_b[I8_MAX_NT][I8_MAX_MB];
    for (int c = 0; c < NT; c++) {
        qs[c] = w->qs + (t + c) * i8_tile_qs_bytes(w);
        hb[c] = w->hbits ? w->hbits + (t + c) * i8_planes(w) * quads : NULL;
        for (int i = 0; i < MB; i++) acc_s[c][i] = acc_b[c][i] = _mm512_setzero_ps();
    }
    for (int i = 0; i < MB; i++) {
        xq[i] = (const I8Quad *)(x->xq + (r + i) * k);
        d[i] = x->d + (r + i) * (k / I8_BLOCK);
        xb[i] = x->xb + (r + i) * groups;
        if (LEVELS == 2) {
            xq2[i] = (const I8Quad *)(x->xq2 + (r + i) * k);
            d2[i] = x->d2 + (r + i) * (k / I8_BLOCK);
        }
    }
    for (Py_ssize_t g = 0; g < groups; g++) {
        __m512 tsum[I8_MAX_NT][I8_MAX_MB];
        for (int c = 0; c < NT; c++)
            for (int i = 0; i < MB; i++) tsum[c][i] = _mm512_setzero_ps();
        for (Py_ssize_t part = 0; part < portions; part++) {
            const Py_ssize_t e = g * group_size + part * portion, blk = e / I8_BLOCK;
            __m512i isum[I8_MAX_NT][I8_MAX_MB], isum2[I8_MAX_NT][I8_MAX_MB];
            for (int c = 0; c < NT; c++)
                for (int i = 0; i < MB; i++) isum[c][i] = isum2[c][i] = _mm512_setzero_si512();
            /* a portion's 2 or 4 steps unrolled: the row pointers advance once a block */
#pragma GCC unroll 4
            for (Py_ssize_t p = e / 4; p < (e + portion) / 4; p += 2) {
                for (int c = 0; c < NT; c++) {
                    __m512i lo, hi;
                    const char *ahead = (const char *)qs[c] + (BITS == 8 ? p : p / 2) * 64;
                    _mm_prefetch(ahead + I8_PREFETCH, _MM_HINT_T0);
                    if (BITS == 8) _mm_prefetch(ahead + 64 + I8_PREFETCH, _MM_HINT_T0);
                    weights512(qs[c], hb[c], quads, p, BITS, &lo, &hi);
                    for (int i = 0; i < MB; i++) {
                        isum[c][i] = dpbusd_quad(isum[c][i], lo, xq[i] + p);
                        isum[c][i] = dpbusd_quad(isum[c][i], hi, xq[i] + p + 1);
                        if (LEVELS == 2) {
                            isum2[c][i] = dpbusd_quad(isum2[c][i], lo, xq2[i] + p);
                            isum2[c][i] = dpbusd_quad(isum2[c][i], hi, xq2[i] + p + 1);
                        }
                    }
                }
            }
            for (int i = 0; i < MB; i++) {
                const __m512 dv = _mm512_set1_ps(d[i][blk]);
                for (int c = 0; c < NT; c++) {
                    tsum[c][i] = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(isum[c][i]), tsum[c][i]);
                    if (LEVELS == 2)
                        tsum[c][i] = _mm512_fmadd_ps(_mm512_set1_ps(d2[i][blk]),
                                                     _mm512_cvtepi32_ps(isum2[c][i]), tsum[c][i]);
                }
            }
        }
        for (int c = 0; c < NT; c++) {
            const __m512 sv = params512(w, w->scales, ((t + c) * groups + g) * I8_TILE);
            for (int i = 0; i < MB; i++) acc_s[c][i] = _mm512_fmadd_ps(sv, tsum[c][i], acc_s[c][i]);
        }
    }
    for (Py_ssize_t g = 0; g < groups; g++) {
        for (int c = 0; c < NT; c++) {
            const Py_ssize_t at = ((t + c) * groups + g) * I8_TILE;
            const __m512 bv = w->zero ? _mm512_mul_ps(params512(w, w->scales, at),
                                                      _mm512_set1_ps((float)-w->zero))
                                      : params512(w, w->biases, at);
            for (int i = 0; i < MB; i++)
                acc_b[c][i] = _mm512_fmadd_ps(bv, _mm512_set1_ps(xb[i][g]), acc_b[c][i]);
        }
    }
    for (int c = 0; c < NT; c++) {
        const Py_ssize_t left = w->n - (t + c) * I8_TILE;
        const __mmask16 keep = left >= I8_TILE ? 0xffff : (__mmask16)((1u << left) - 1);
        for (int i = 0; i < MB; i++)
            _mm512_mask_storeu_ps(out + (r + i) * ld + (t + c) * I8_TILE, keep,
                                  _mm512_add_ps(acc_s[c][i], acc_b[c][i]));
    }
}

/* Tiles [t0, t1) against MB rows from r: register tiles of NT tiles while they fit, then
 * of fewer (halving), each row computed the same way in any of them. */
static inline __attribute__((always_inline)) void
tiles512(const I8Mat *w, const I8X *x, Py_ssize_t r, Py_ssize_t t0, Py_ssize_t t1, float *out,
         Py_ssize_t ld, const int BITS, const int NT, const int MB, const int GS) {
    Py_ssize_t t = t0;
    if (NT >= 4)
        for (; t + 4 <= t1; t += 4) tile512(w, x, r, t, out, ld, BITS, 4, MB, GS);
    if (NT >= 2)
        for (; t + 2 <= t1; t += 2) tile512(w, x, r, t, out, ld, BITS, 2, MB, GS);
    for (; t < t1; t++) tile512(w, x, r, t, out, ld, BITS, 1, MB, GS);
}

/* Rows [r0, r1) x tiles [t0, t1) in passes of up to 8 rows, 4 to 8 accumulators a pass:
 * 4 tiles x 1 row (a decode row's 4 dpbusd chains: 8 were slower, more pointers than
 * GPRs), 4 x 2, 2 x 3 or 4, 1 tile x 5 to 8 rows. Groups of 64 and more (MLX's) keep
 * each t across blocks: at most 4 rows a pass there, so nothing spills. */
static inline __attribute__((always_inline)) void
rows512(const I8Mat *w, const I8X *x, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t t0, Py_ssize_t t1,
        float *out, Py_ssize_t ld, const int BITS, const int GS) {
    const Py_ssize_t most = GS ? I8_MAX_MB : 4;
    for (Py_ssize_t r = r0; r < r1;) {
        const Py_ssize_t mb = r1 - r < most ? r1 - r : most;
        switch (mb) {
        case 1: tiles512(w, x, r, t0, t1, out, ld, BITS, 4, 1, GS); break;
        case 2: tiles512(w, x, r, t0, t1, out, ld, BITS, GS ? 4 : 2, 2, GS); break;
        case 3: tiles512(w, x, r, t0, t1, out, ld, BITS, GS ? 2 : 1, 3, GS); break;
        case 4: tiles512(w, x, r, t0, t1, out, ld, BITS, GS ? 2 : 1, 4, GS); break;
        case 5: tiles512(w, x, r, t0, t1, out, ld, BITS, 1, GS ? 5 : 1, GS); break;
        case 6: tiles512(w, x, r, t0, t1, out, ld, BITS, 1, GS ? 6 : 1, GS); break;
        case 7: tiles512(w, x, r, t0, t1, out, ld, BITS, 1, GS ? 7 : 1, GS); break;
        default: tiles512(w, x, r, t0, t1, out, ld, BITS, 1, GS ? 8 : 1, GS); break;
        }
        r += mb;
    }
}

static inline __attribute__((always_inline)) void
groups512(const I8Mat *w, const I8X *x, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t t0, Py_ssize_t t1,
          float *out, Py_ssize_t ld, const int BITS) {
    switch (w->group_size) {
    case 16: rows512(w, x, r0, r1, t0, t1, out, ld, BITS, 16); break;
    case 32: rows512(w, x, r0, r1, t0, t1, out, ld, BITS, 32); break;
    default: rows512(w, x, r0, r1, t0, t1, out, ld, BITS, 0); break;
    }
}

static void block_avx512vnni(const I8Mat *w, const I8X *x, Py_ssize_t r0, Py_ssize_t r1,
                             Py_ssize_t t0, Py_ssize_t t1, float *out, Py_ssize_t ld) {
    switch (w->bits) {
    case 8: groups512(w, x, r0, r1, t0, t1, out, ld, 8); break;
    case 6: groups512(w, x, r0, r1, t0, t1, out, ld, 6); break;
    case 5: groups512(w, x, r0, r1, t0, t1, out, ld, 5); break;
    default: groups512(w, x, r0, r1, t0, t1, out, ld, 4); break;
    }
}

#pragma GCC pop_options

/* -- AVX2 and AVX-VNNI ------------------------------------------------------------------ */

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#define I8_YMM_VNNI 1
#define I8_YMM_SUFFIX avxvnni
#include "int8_ymm.h"
#undef I8_YMM_VNNI
#undef I8_YMM_SUFFIX
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define I8_YMM_VNNI 0
#define I8_YMM_SUFFIX avx2
#include "int8_ymm.h"
#undef I8_YMM_VNNI
#undef I8_YMM_SUFFIX
#pragma GCC pop_options
#endif /* I8_X86 */

/* -- quantization ----------------------------------------------------------------------- */

typedef struct {
    const float *x;
    Py_ssize_t m, k, rows_per_chunk;
    int group_size;
    int8_t *xq, *xq2;   /* xq2, d2, hsum2: NULL for one level */
    float *d, *xb, *d2;
    int32_t *hsum, *hsum2; /* k / 16 per row */
} QuantJob;

static void quant_chunk(const void *ctx, Py_ssize_t chunk) {
    const QuantJob *job = ctx;
    const Py_ssize_t k = job->k, groups = k / job->group_size;
    const Py_ssize_t r0 = chunk * job->rows_per_chunk;
    const Py_ssize_t r1 = r0 + job->rows_per_chunk < job->m ? r0 + job->rows_per_chunk : job->m;
    for (Py_ssize_t r = r0; r < r1; r++) {
        const int two = job->xq2 != NULL;
        const I8Row row = {job->xq + r * k,
                           job->d + r * (k / I8_BLOCK),
                           job->xb + r * groups,
                           job->hsum + r * (k / 16),
                           two ? job->xq2 + r * k : NULL,
                           two ? job->d2 + r * (k / I8_BLOCK) : NULL,
                           two ? job->hsum2 + r * (k / 16) : NULL};
        i8_quantize_row(job->x + r * k, k, job->group_size, &row);
    }
}

/* -- drivers ---------------------------------------------------------------------------- */

int i8_path_supported(int path) {
#if I8_X86
    __builtin_cpu_init();
    switch (path) {
    case I8_AVX512VNNI:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
               __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case I8_AVXVNNI:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avxvnni") &&
               __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case I8_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    default:
        return path == I8_GENERIC;
    }
#else
    return path == I8_GENERIC;
#endif
}

static int best_path(void) {
    for (int p = I8_NUM_PATHS - 1; p > I8_GENERIC; p--)
        if (i8_path_supported(p)) return p;
    return I8_GENERIC;
}

int i8_path = -1; /* chosen on first use (best_path), or by the module's set_int8_path */

int i8_current_path(void) {
    if (i8_path < 0) i8_path = best_path();
    return i8_path;
}

static I8BlockFn block_fn(void) {
    switch (i8_current_path()) {
#if I8_X86
    case I8_AVX512VNNI:
        return block_avx512vnni;
    case I8_AVXVNNI:
        return block_avxvnni;
    case I8_AVX2:
        return block_avx2;
#endif
    default:
        return block_generic;
    }
}

/* Chunks of the pool a thread: few, as each costs more than its claim. Two atomics on the
 * pool's shared line, and a chunk's first weights come cold: the prefetch of a tile loop
 * runs ahead into the next tile, which another thread may have. An 8-row verify of the
 * default model in chunks of 4 tiles took 8.5 ms, in 2 chunks a thread 7.3 ms (timed by
 * hand, one process alternating the two); a decode row's head went from 192 chunks of
 * ~128k multiply-adds to 16, a decode step 4.2 -> 3.9 ms. A late thread's chunks are still
 * taken by the others (they claim from one counter). */
#define CHUNKS_A_THREAD 2
#define CHUNKS_A_THREAD_DECODE 8
#define I8_PANEL_BYTES (1 << 18) /* of quantized x per panel (L2 holds it with the tiles) */

typedef struct {
    const I8Mat *w;
    const I8X *x;
    float *out;
    Py_ssize_t ld, m, panel_rows, tiles_per_chunk, chunks_per_panel;
    I8BlockFn fn;
} I8Job;

static void matmul_chunk(const void *ctx, Py_ssize_t chunk) {
    const I8Job *job = ctx;
    const Py_ssize_t tiles = i8_tiles(job->w);
    const Py_ssize_t r0 = chunk / job->chunks_per_panel * job->panel_rows;
    const Py_ssize_t t0 = chunk % job->chunks_per_panel * job->tiles_per_chunk;
    const Py_ssize_t r1 = r0 + job->panel_rows < job->m ? r0 + job->panel_rows : job->m;
    const Py_ssize_t t1 = t0 + job->tiles_per_chunk < tiles ? t0 + job->tiles_per_chunk : tiles;
    { /* the chunk's first weights and parameters, before its loop asks for them */
        const I8Mat *w = job->w;
        const char *qs = (const char *)(w->qs + t0 * i8_tile_qs_bytes(w));
        for (int b = 0; b < I8_PREFETCH; b += 64) __builtin_prefetch(qs + b, 0, 3);
        const Py_ssize_t pbytes = (w->half ? 2 : 4) * I8_TILE * (w->k / w->group_size);
        const char *sc = (const char *)w->scales + t0 * pbytes;
        const char *bi = w->biases ? (const char *)w->biases + t0 * pbytes : NULL;
        for (Py_ssize_t b = 0; b < pbytes && b < 1024; b += 64) {
            __builtin_prefetch(sc + b, 0, 3);
            if (bi) __builtin_prefetch(bi + b, 0, 3);
        }
    }
    job->fn(job->w, job->x, r0, r1, t0, t1, job->out, job->ld);
}

int i8_matmul(const I8Mat *w, const float *x, Py_ssize_t m, float *out, Py_ssize_t ld_out) {
    if (m <= 0 || w->n <= 0) return 0;
    const Py_ssize_t k = w->k, groups = k / w->group_size;
    const int levels = i8_levels(w->bits);
    const size_t xq_bytes = (size_t)(m * k + 63) / 64 * 64;
    /* per level xq, d, hsum; xb once */
    const size_t floats = (size_t)(levels * m * (k / I8_BLOCK + k / 16) + m * groups);
    char *scratch = alloc_aligned(levels * xq_bytes + floats * sizeof(float));
    if (!scratch) return -1;
    int8_t *xq = (int8_t *)scratch, *xq2 = levels == 2 ? xq + xq_bytes : NULL;
    float *d = (float *)(scratch + levels * xq_bytes), *xb = d + m * (k / I8_BLOCK);
    int32_t *hsum = (int32_t *)(xb + m * groups);
    float *d2 = levels == 2 ? (float *)(hsum + m * (k / 16)) : NULL;
    int32_t *hsum2 = levels == 2 ? (int32_t *)(d2 + m * (k / I8_BLOCK)) : NULL;
    const I8BlockFn fn = block_fn();
    /* rows a unit of the quantization: ~16k elements, or a verify's rows over the threads
     * (serial, 8 rows' quantization kept the other threads waiting before each matmul) */
    const Py_ssize_t threads = pool_num_threads(), spin = m <= 8 ? SPIN_NS : 0;
    Py_ssize_t quant_rows = (1 << 14) / k + 1;
    if (m >= 4 && m < quant_rows * threads) quant_rows = (m + threads - 1) / threads;
    const QuantJob qjob = {x, m, k, quant_rows, w->group_size, xq, xq2, d, xb, d2, hsum, hsum2};
    if (m <= quant_rows)
        quant_chunk(&qjob, 0);
    else
        parallel_for(quant_chunk, &qjob, (m + quant_rows - 1) / quant_rows, spin);
    const I8X xs = {xq, d, xb, xq2, d2};
    const Py_ssize_t tiles = i8_tiles(w);
    Py_ssize_t panel = I8_PANEL_BYTES / k;
    panel = panel < 8 ? 8 : panel > m ? m : panel;
    /* CHUNKS_A_THREAD chunks a thread, of whole register tiles (rows512: 4 tiles for 1 or
     * 2 rows, 2 for 3 or 4, 1 from 5) */
    const Py_ssize_t unit = m <= 2 ? 4 : m <= 4 ? 2 : 1;
    Py_ssize_t per_chunk = tiles / ((m <= 2 ? CHUNKS_A_THREAD_DECODE : CHUNKS_A_THREAD) * threads);
    per_chunk = per_chunk < unit ? unit : (per_chunk + unit - 1) / unit * unit;
    if (per_chunk > tiles) per_chunk = tiles;
    const Py_ssize_t per_panel = (tiles + per_chunk - 1) / per_chunk;
    const I8Job job = {w, &xs, out, ld_out, m, panel, per_chunk, per_panel, fn};
    parallel_for(matmul_chunk, &job, (m + panel - 1) / panel * per_panel, spin);
    free_aligned(scratch);
    return 0;
}
