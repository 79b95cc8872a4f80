/* Matrix products against MLX affine-quantized weights, without dequantizing them first.
 *
 * Layout (MLX's, see kernels/ops.py QuantizedWeight): W is [n, k]; row j is packed into
 * k * bits / 8 little-endian bytes, element i of a row at bits (i % (8 / bits)) * bits of
 * byte i / (8 / bits); each run of group_size elements has a scale and a bias (float32, or
 * float16 as GGUF stores them): w = scale * q + bias.
 *
 * matmul computes out[m, n] = x[m, k] @ W^T in float32. Decode (m = 1) is bound by the
 * bytes of W it reads, so W stays packed (4-bit: ~0.62 bytes per weight with float16
 * scales, against 4 for a dequantized copy) and each weight is dequantized in registers.
 * For 4 bits a 32-element chunk is 16 bytes whose low nibbles hold the even elements and
 * high nibbles the odd ones, so x is repacked once per call with each chunk as
 * [even 16 | odd 16]; on AVX-512 a nibble becomes its weight by one permute from the
 * group's 16-entry table scale * [0..15] + bias. A register tile of up to 8 rows of x
 * reuses every dequantized chunk, so a verify of 8 rows reads W once.
 *
 * Three code paths, chosen at run time among those the compiler built: AVX-512, AVX2
 * (most x86 machines without AVX-512) and portable C. kernels/qmatmul.py holds the plain
 * NumPy reference all three are tested against. Work is split over output columns (and,
 * for many rows, cache-sized panels of x) by a small thread pool built for decode's
 * ~120 short calls per token on cores other processes may share (see parallel_for).
 *
 * Sections: x preparation, portable C, AVX-512, AVX2, thread pool, drivers, bindings.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#ifndef _WIN32
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#define HAVE_THREADS 1
#else
#define HAVE_THREADS 0
#endif
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define HAVE_AVX2 1
#else
#define HAVE_AVX2 0
#endif
#if HAVE_AVX2 && defined(__AVX512F__)
#define HAVE_AVX512 1
#else
#define HAVE_AVX512 0
#endif

enum { ISA_GENERIC, ISA_AVX2, ISA_AVX512 };
static const char *const ISA_NAMES[] = {"generic", "avx2", "avx512"};
static int isa = HAVE_AVX512 ? ISA_AVX512 : HAVE_AVX2 ? ISA_AVX2 : ISA_GENERIC;

#define CHUNK 32       /* elements per unit of work: 16 bytes at 4 bits, 32 at 8 */
#define COL_TILE 4     /* output columns a tile set covers (a multiple of every tile's) */
#define MAX_MB 8       /* rows of x per register tile */
#define GROUP_BLOCK 64 /* groups whose scales and biases a tile converts at a time */

typedef struct {
    const uint8_t *packed; /* [n, k * bits / 8] */
    const void *scales;    /* [n, k / group_size], float32 or float16 (half) */
    const void *biases;    /* [n, k / group_size], same type */
    Py_ssize_t n, k;
    int group_size, bits, half;
} QMat;

static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        const float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    const uint32_t bits =
        exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

/* Elements [start, start + count) of a scales/biases array into dst as float32. Tiles
 * convert a block at a time: one conversion per group would cost a third of a 4-bit
 * tile's instructions, and copying even float32 keeps them at fixed stack offsets. */
static inline void params_f32(const QMat *w, const void *a, Py_ssize_t start, int count,
                              float *dst) {
    int i = 0;
    if (!w->half) {
        memcpy(dst, (const float *)a + start, (size_t)count * sizeof(float));
        return;
    }
    const uint16_t *h = (const uint16_t *)a + start;
#if defined(__AVX512F__)
    for (; i + 16 <= count; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
#endif
#if defined(__F16C__)
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < count; i++) dst[i] = half_to_float(h[i]);
}

static inline const uint8_t *row_bytes(const QMat *w, Py_ssize_t j) {
    return w->packed + j * (w->k * w->bits / 8);
}

/* -- x preparation --------------------------------------------------------------------- */

/* Cache-line aligned: a 64-byte load that straddles two lines costs two (measured: the
 * 8-row tile ran at 50 instead of 85 GMAC/s on a 16-byte aligned x). */
static void *alloc_aligned(size_t size) {
#ifdef _WIN32
    return _aligned_malloc(size, 64);
#else
    return aligned_alloc(64, (size + 63) / 64 * 64);
#endif
}

static void free_aligned(void *p) {
#ifdef _WIN32
    _aligned_free(p);
#else
    free(p);
#endif
}

/* x [m, k] as the kernels read it: in blocks of MAX_MB rows (the last may be shorter),
 * each block chunk-major, [chunk][row][32], so a register tile finds its rows' chunks at
 * fixed offsets from one pointer; for 4 bits each chunk is [even 16 | odd 16] to match
 * the nibble order. Block b starts at xp + b * MAX_MB * k. */
static void pack_x(const float *x, float *xp, Py_ssize_t m, Py_ssize_t k, int bits) {
    for (Py_ssize_t r0 = 0; r0 < m; r0 += MAX_MB) {
        const Py_ssize_t mb = m - r0 < MAX_MB ? m - r0 : MAX_MB;
        for (Py_ssize_t c = 0; c < k / CHUNK; c++) {
            for (Py_ssize_t r = 0; r < mb; r++) {
                const float *src = x + (r0 + r) * k + c * CHUNK;
                float *dst = xp + r0 * k + (c * mb + r) * CHUNK;
                for (int i = 0; i < CHUNK / 2; i++) {
                    dst[i] = bits == 4 ? src[2 * i] : src[i];
                    dst[CHUNK / 2 + i] = bits == 4 ? src[2 * i + 1] : src[CHUNK / 2 + i];
                }
            }
        }
    }
}

/* -- portable C ------------------------------------------------------------------------ */

/* One output: dot(x row, W row j); xr is the row's first chunk in pack_x's layout, whose
 * chunks are `stride` floats apart. */
static float dot_generic(const QMat *w, Py_ssize_t j, const float *xr, Py_ssize_t stride) {
    const Py_ssize_t groups = w->k / w->group_size;
    const int chunks_per_group = w->group_size / CHUNK;
    const uint8_t *p = row_bytes(w, j);
    float acc[CHUNK] = {0};
    for (Py_ssize_t g = 0; g < groups; g++) {
        float s, b;
        params_f32(w, w->scales, j * groups + g, 1, &s);
        params_f32(w, w->biases, j * groups + g, 1, &b);
        for (int t = 0; t < chunks_per_group; t++) {
            const Py_ssize_t c = g * chunks_per_group + t;
            const float *xc = xr + c * stride;
            if (w->bits == 4) {
                const uint8_t *q = p + c * (CHUNK / 2);
                for (int i = 0; i < CHUNK / 2; i++) {
                    acc[i] += (s * (float)(q[i] & 15) + b) * xc[i];
                    acc[CHUNK / 2 + i] += (s * (float)(q[i] >> 4) + b) * xc[CHUNK / 2 + i];
                }
            } else {
                const uint8_t *q = p + c * CHUNK;
                for (int i = 0; i < CHUNK; i++) acc[i] += (s * (float)q[i] + b) * xc[i];
            }
        }
    }
    float total = 0.0f;
    for (int i = 0; i < CHUNK; i++) total += acc[i];
    return total;
}

static void columns_generic(const QMat *w, const float *xp, float *out, Py_ssize_t m,
                            Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t j0, Py_ssize_t j1) {
    for (Py_ssize_t j = j0; j < j1; j++) {
        for (Py_ssize_t r = r0; r < r1; r++) {
            const Py_ssize_t b = r - r % MAX_MB, mb = m - b < MAX_MB ? m - b : MAX_MB;
            const float *xr = xp + b * w->k + (r - b) * CHUNK;
            out[r * w->n + j] = dot_generic(w, j, xr, mb * CHUNK);
        }
    }
}

static void dequant_row_generic(const QMat *w, Py_ssize_t j, float *dst) {
    const Py_ssize_t groups = w->k / w->group_size;
    const uint8_t *p = row_bytes(w, j);
    for (Py_ssize_t g = 0; g < groups; g++) {
        float s, b;
        params_f32(w, w->scales, j * groups + g, 1, &s);
        params_f32(w, w->biases, j * groups + g, 1, &b);
        float *d = dst + g * w->group_size;
        if (w->bits == 4) {
            const uint8_t *q = p + g * (w->group_size / 2);
            for (int i = 0; i < w->group_size / 2; i++) {
                d[2 * i] = s * (float)(q[i] & 15) + b;
                d[2 * i + 1] = s * (float)(q[i] >> 4) + b;
            }
        } else {
            const uint8_t *q = p + g * w->group_size;
            for (int i = 0; i < w->group_size; i++) d[i] = s * (float)q[i] + b;
        }
    }
}

/* A tile computes out[r, j0 + c] for r < MB rows of one x block and c < NB columns. */
typedef void (*TileFn)(const QMat *, const float *, float *, Py_ssize_t);
typedef struct {
    TileFn wide; /* NB columns */
    int nb;
    TileFn narrow; /* 1 column, for the tail of n */
} TileSet;

/* Output columns [j0, j1) for rows [r0, r1) of m (r0 a multiple of MAX_MB): a column
 * tile's bytes of W stay in L1 while the row blocks of x pass over them. tiles[mb]
 * handles a block of mb rows. */
static void columns_tiled(const QMat *w, const float *xp, float *out, Py_ssize_t m,
                          Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t j0, Py_ssize_t j1,
                          const TileSet *tiles) {
    for (Py_ssize_t r = r0; r < r1; r += MAX_MB) {
        const Py_ssize_t mb = m - r < MAX_MB ? m - r : MAX_MB;
        const TileSet *t = &tiles[mb];
        const float *xr = xp + r * w->k;
        float *o = out + r * w->n;
        Py_ssize_t j = j0;
        for (; j + t->nb <= j1; j += t->nb) t->wide(w, xr, o, j);
        for (; j < j1; j++) t->narrow(w, xr, o, j);
    }
}

#define TILESET(ISA, BITS, MB, NB) {tile##ISA##_q##BITS##_##MB##x##NB, NB, tile##ISA##_q##BITS##_##MB##x1}

/* -- AVX-512 --------------------------------------------------------------------------- */
#if HAVE_AVX512

/* A register tile: MB rows of x (a block in pack_x's layout) against NB consecutive rows
 * of W, over all of k. Each 32-element chunk of a W row is dequantized once into two
 * vectors (lo, hi) used by all MB rows. 4 bits: lo/hi are the even/odd elements and come
 * from the group's table scale * [0..15] + bias by one permute each; 8 bits: the first and
 * second 16 elements, converted and scaled. SPLIT keeps lo and hi products in separate
 * accumulators when the tile is too small to hide the FMA latency otherwise. BITS, MB, NB
 * and SPLIT are compile-time constants at each use. */
static inline __attribute__((always_inline)) void
tile512(const QMat *w, const float *xp, float *out, Py_ssize_t j0, const int BITS,
        const int MB, const int NB, const int SPLIT) {
    const Py_ssize_t groups = w->k / w->group_size, row_stride = w->k * BITS / 8;
    const int chunks_per_group = w->group_size / CHUNK;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const uint8_t *p = row_bytes(w, j0);
    __m512 acc[MAX_MB][COL_TILE][2];
#pragma GCC unroll 8
    for (int r = 0; r < MB; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NB; c++) acc[r][c][0] = acc[r][c][1] = _mm512_setzero_ps();
    float scales[COL_TILE][GROUP_BLOCK], biases[COL_TILE][GROUP_BLOCK];
    for (Py_ssize_t g0 = 0; g0 < groups; g0 += GROUP_BLOCK) {
        const int count = groups - g0 < GROUP_BLOCK ? (int)(groups - g0) : GROUP_BLOCK;
#pragma GCC unroll 4
        for (int c = 0; c < NB; c++) {
            params_f32(w, w->scales, (j0 + c) * groups + g0, count, scales[c]);
            params_f32(w, w->biases, (j0 + c) * groups + g0, count, biases[c]);
        }
        for (int gi = 0; gi < count; gi++) {
            __m512 sv[COL_TILE], bv[COL_TILE], table[COL_TILE];
#pragma GCC unroll 4
            for (int c = 0; c < NB; c++) {
                sv[c] = _mm512_set1_ps(scales[c][gi]);
                bv[c] = _mm512_set1_ps(biases[c][gi]);
                if (BITS == 4) table[c] = _mm512_fmadd_ps(iota, sv[c], bv[c]);
            }
            for (int t = 0; t < chunks_per_group; t++) {
                const Py_ssize_t chunk = (g0 + gi) * chunks_per_group + t;
                __m512 lo[COL_TILE], hi[COL_TILE];
#pragma GCC unroll 4
                for (int c = 0; c < NB; c++) {
                    const uint8_t *q = p + c * row_stride + chunk * (CHUNK * BITS / 8);
                    const __m512i q0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
                    if (BITS == 4) {
                        /* vpermps reads the low 4 bits of each index: the low nibble as is */
                        lo[c] = _mm512_permutexvar_ps(q0, table[c]);
                        hi[c] = _mm512_permutexvar_ps(_mm512_srli_epi32(q0, 4), table[c]);
                    } else {
                        const __m512i q1 =
                            _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)));
                        lo[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q0), sv[c], bv[c]);
                        hi[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q1), sv[c], bv[c]);
                    }
                }
                const float *xc0 = xp + chunk * (MB * CHUNK);
#pragma GCC unroll 8
                for (int r = 0; r < MB; r++) {
                    const float *xc = xc0 + r * CHUNK;
                    const __m512 x0 = _mm512_loadu_ps(xc), x1 = _mm512_loadu_ps(xc + 16);
#pragma GCC unroll 4
                    for (int c = 0; c < NB; c++) {
                        acc[r][c][0] = _mm512_fmadd_ps(lo[c], x0, acc[r][c][0]);
                        acc[r][c][SPLIT] = _mm512_fmadd_ps(hi[c], x1, acc[r][c][SPLIT]);
                    }
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MB; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NB; c++) {
            const __m512 a = SPLIT ? _mm512_add_ps(acc[r][c][0], acc[r][c][1]) : acc[r][c][0];
            out[r * w->n + j0 + c] = _mm512_reduce_add_ps(a);
        }
}

/* One function per (bits, MB, NB); the constants make every loop above unroll. */
#define DEFINE_TILE512(BITS, MB, NB, SPLIT)                                                   \
    static void tile512_q##BITS##_##MB##x##NB(const QMat *w, const float *xp, float *out,     \
                                              Py_ssize_t j0) {                                \
        tile512(w, xp, out, j0, BITS, MB, NB, SPLIT);                                         \
    }
#define DEFINE_TILES512(BITS)                                                                 \
    DEFINE_TILE512(BITS, 1, 4, 1)                                                             \
    DEFINE_TILE512(BITS, 2, 4, 0)                                                             \
    DEFINE_TILE512(BITS, 3, 2, 1)                                                             \
    DEFINE_TILE512(BITS, 4, 2, 0)                                                             \
    DEFINE_TILE512(BITS, 5, 2, 0)                                                             \
    DEFINE_TILE512(BITS, 6, 2, 0)                                                             \
    DEFINE_TILE512(BITS, 7, 2, 0)                                                             \
    DEFINE_TILE512(BITS, 8, 2, 0)                                                             \
    DEFINE_TILE512(BITS, 1, 1, 1)                                                             \
    DEFINE_TILE512(BITS, 2, 1, 1)                                                             \
    DEFINE_TILE512(BITS, 3, 1, 1)                                                             \
    DEFINE_TILE512(BITS, 4, 1, 0)                                                             \
    DEFINE_TILE512(BITS, 5, 1, 0)                                                             \
    DEFINE_TILE512(BITS, 6, 1, 0)                                                             \
    DEFINE_TILE512(BITS, 7, 1, 0)                                                             \
    DEFINE_TILE512(BITS, 8, 1, 0)
DEFINE_TILES512(4)
DEFINE_TILES512(8)

#define TILESETS512(BITS)                                                                     \
    {{0, 0, 0},                                                                               \
     TILESET(512, BITS, 1, 4),                                                                \
     TILESET(512, BITS, 2, 4),                                                                \
     TILESET(512, BITS, 3, 2),                                                                \
     TILESET(512, BITS, 4, 2),                                                                \
     TILESET(512, BITS, 5, 2),                                                                \
     TILESET(512, BITS, 6, 2),                                                                \
     TILESET(512, BITS, 7, 2),                                                                \
     TILESET(512, BITS, 8, 2)}
static const TileSet TILES512_Q4[MAX_MB + 1] = TILESETS512(4);
static const TileSet TILES512_Q8[MAX_MB + 1] = TILESETS512(8);
#endif /* HAVE_AVX512 */

/* -- AVX2 ------------------------------------------------------------------------------ */
#if HAVE_AVX2

/* tile512's scheme with 8-lane vectors and no 16-entry permute: a chunk dequantizes into
 * four vectors (4 bits: even 0-7, even 8-15, odd 0-7, odd 8-15; 8 bits: in order) by
 * convert and FMA. With 16 registers the tiles are narrower; ACC independent accumulators
 * per output hide the FMA latency. */
static inline __attribute__((always_inline)) void
tile256(const QMat *w, const float *xp, float *out, Py_ssize_t j0, const int BITS,
        const int MB, const int NB, const int ACC) {
    const Py_ssize_t groups = w->k / w->group_size, row_stride = w->k * BITS / 8;
    const int chunks_per_group = w->group_size / CHUNK;
    const __m256i low4 = _mm256_set1_epi32(15);
    const uint8_t *p = row_bytes(w, j0);
    __m256 acc[MAX_MB][2][4];
#pragma GCC unroll 8
    for (int r = 0; r < MB; r++)
#pragma GCC unroll 2
        for (int c = 0; c < NB; c++)
#pragma GCC unroll 4
            for (int a = 0; a < ACC; a++) acc[r][c][a] = _mm256_setzero_ps();
    float scales[2][GROUP_BLOCK], biases[2][GROUP_BLOCK];
    for (Py_ssize_t g0 = 0; g0 < groups; g0 += GROUP_BLOCK) {
        const int count = groups - g0 < GROUP_BLOCK ? (int)(groups - g0) : GROUP_BLOCK;
#pragma GCC unroll 2
        for (int c = 0; c < NB; c++) {
            params_f32(w, w->scales, (j0 + c) * groups + g0, count, scales[c]);
            params_f32(w, w->biases, (j0 + c) * groups + g0, count, biases[c]);
        }
        for (int gi = 0; gi < count; gi++) {
            for (int t = 0; t < chunks_per_group; t++) {
                const Py_ssize_t chunk = (g0 + gi) * chunks_per_group + t;
                const float *xc0 = xp + chunk * (MB * CHUNK);
#pragma GCC unroll 2
                for (int c = 0; c < NB; c++) {
                    const __m256 sv = _mm256_set1_ps(scales[c][gi]);
                    const __m256 bv = _mm256_set1_ps(biases[c][gi]);
                    const uint8_t *q = p + c * row_stride + chunk * (CHUNK * BITS / 8);
                    __m256i qi[4];
                    if (BITS == 4) {
                        const __m128i raw = _mm_loadu_si128((const __m128i *)q);
                        const __m256i b0 = _mm256_cvtepu8_epi32(raw);
                        const __m256i b1 = _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8));
                        qi[0] = _mm256_and_si256(b0, low4);
                        qi[1] = _mm256_and_si256(b1, low4);
                        qi[2] = _mm256_srli_epi32(b0, 4);
                        qi[3] = _mm256_srli_epi32(b1, 4);
                    } else {
#pragma GCC unroll 4
                        for (int v = 0; v < 4; v++)
                            qi[v] = _mm256_cvtepu8_epi32(
                                _mm_loadl_epi64((const __m128i *)(q + 8 * v)));
                    }
#pragma GCC unroll 4
                    for (int v = 0; v < 4; v++) {
                        const __m256 wv = _mm256_fmadd_ps(_mm256_cvtepi32_ps(qi[v]), sv, bv);
#pragma GCC unroll 8
                        for (int r = 0; r < MB; r++) {
                            const __m256 xv = _mm256_loadu_ps(xc0 + r * CHUNK + 8 * v);
                            acc[r][c][v % ACC] = _mm256_fmadd_ps(wv, xv, acc[r][c][v % ACC]);
                        }
                    }
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MB; r++)
#pragma GCC unroll 2
        for (int c = 0; c < NB; c++) {
            __m256 a = acc[r][c][0];
#pragma GCC unroll 4
            for (int i = 1; i < ACC; i++) a = _mm256_add_ps(a, acc[r][c][i]);
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            h = _mm_add_ss(h, _mm_movehdup_ps(h));
            out[r * w->n + j0 + c] = _mm_cvtss_f32(h);
        }
}

#define DEFINE_TILE256(BITS, MB, NB, ACC)                                                     \
    static void tile256_q##BITS##_##MB##x##NB(const QMat *w, const float *xp, float *out,     \
                                              Py_ssize_t j0) {                                \
        tile256(w, xp, out, j0, BITS, MB, NB, ACC);                                           \
    }
#define DEFINE_TILES256(BITS)                                                                 \
    DEFINE_TILE256(BITS, 1, 2, 4)                                                             \
    DEFINE_TILE256(BITS, 1, 1, 4)                                                             \
    DEFINE_TILE256(BITS, 2, 1, 4)                                                             \
    DEFINE_TILE256(BITS, 3, 1, 2)                                                             \
    DEFINE_TILE256(BITS, 4, 1, 2)                                                             \
    DEFINE_TILE256(BITS, 5, 1, 1)                                                             \
    DEFINE_TILE256(BITS, 6, 1, 1)                                                             \
    DEFINE_TILE256(BITS, 7, 1, 1)                                                             \
    DEFINE_TILE256(BITS, 8, 1, 1)
DEFINE_TILES256(4)
DEFINE_TILES256(8)

#define TILESETS256(BITS)                                                                     \
    {{0, 0, 0},                                                                               \
     TILESET(256, BITS, 1, 2),                                                                \
     TILESET(256, BITS, 2, 1),                                                                \
     TILESET(256, BITS, 3, 1),                                                                \
     TILESET(256, BITS, 4, 1),                                                                \
     TILESET(256, BITS, 5, 1),                                                                \
     TILESET(256, BITS, 6, 1),                                                                \
     TILESET(256, BITS, 7, 1),                                                                \
     TILESET(256, BITS, 8, 1)}
static const TileSet TILES256_Q4[MAX_MB + 1] = TILESETS256(4);
static const TileSet TILES256_Q8[MAX_MB + 1] = TILESETS256(8);

/* One W row into dst in element order (the BLAS path's dequantized copy). */
static void dequant_row_avx2(const QMat *w, Py_ssize_t j, float *dst) {
    const Py_ssize_t groups = w->k / w->group_size;
    const int chunks_per_group = w->group_size / CHUNK;
    const uint8_t *p = row_bytes(w, j);
    const __m128i low4 = _mm_set1_epi8(15);
    float scales[GROUP_BLOCK], biases[GROUP_BLOCK];
    for (Py_ssize_t g0 = 0; g0 < groups; g0 += GROUP_BLOCK) {
        const int count = groups - g0 < GROUP_BLOCK ? (int)(groups - g0) : GROUP_BLOCK;
        params_f32(w, w->scales, j * groups + g0, count, scales);
        params_f32(w, w->biases, j * groups + g0, count, biases);
        for (int gi = 0; gi < count; gi++) {
            const __m256 sv = _mm256_set1_ps(scales[gi]), bv = _mm256_set1_ps(biases[gi]);
            for (int t = 0; t < chunks_per_group; t++) {
                const Py_ssize_t chunk = (g0 + gi) * chunks_per_group + t;
                __m128i bytes[2]; /* the chunk's 32 values, one byte each, in order */
                if (w->bits == 4) {
                    const __m128i raw = _mm_loadu_si128((const __m128i *)(p + chunk * 16));
                    const __m128i lo = _mm_and_si128(raw, low4);
                    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
                    bytes[0] = _mm_unpacklo_epi8(lo, hi);
                    bytes[1] = _mm_unpackhi_epi8(lo, hi);
                } else {
                    bytes[0] = _mm_loadu_si128((const __m128i *)(p + chunk * CHUNK));
                    bytes[1] = _mm_loadu_si128((const __m128i *)(p + chunk * CHUNK + 16));
                }
                float *d = dst + chunk * CHUNK;
                for (int v = 0; v < 4; v++) {
                    const __m128i b8 = v % 2 ? _mm_srli_si128(bytes[v / 2], 8) : bytes[v / 2];
                    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b8));
                    _mm256_storeu_ps(d + 8 * v, _mm256_fmadd_ps(q, sv, bv));
                }
            }
        }
    }
}
#endif /* HAVE_AVX2 */

/* -- thread pool ----------------------------------------------------------------------- */

/* A job is `total` chunks; the calling thread and the workers claim them one at a time
 * from an atomic counter, so a worker the OS has not scheduled yet (a loaded machine)
 * costs nothing: the caller takes its share and waits only for chunks already claimed.
 * (OpenMP's barrier would wait for every thread to arrive.) Workers spin briefly between
 * jobs, since a decode step issues one every few tens of microseconds, then sleep. */
typedef void (*ChunkFn)(const void *ctx, Py_ssize_t chunk);

static int num_threads = 1;

#if HAVE_THREADS
#define MAX_WORKERS 255
/* Timings (ns), measured on the 2-core dev machine; see worker_main and parallel_for. */
#define SPIN_NS 100000          /* an idle worker polls this long before it sleeps */
#define PREEMPTED_NS 50000      /* a gap this long in its poll loop: it was descheduled */
#define NO_POLL_NS 50000000LL   /* then no worker polls for this long */
#define STALL_NS 200000         /* a caller waiting this long (more than it worked) stalled */
#define MIN_BACKOFF_NS 20000000LL /* then jobs run on the caller alone: 20 ms ... 2 s */
#define MAX_BACKOFF_NS 2000000000LL

static struct {
    pthread_mutex_t job_lock; /* one job at a time (Python threads may call concurrently) */
    pthread_mutex_t sleep_lock;
    pthread_cond_t wake;
    atomic_uint_fast64_t claim; /* (total << 32) | next unclaimed chunk */
    atomic_llong done;          /* chunks of the current job finished */
    atomic_int sleepers;
    atomic_int epoch; /* bumped when the thread count changes: older workers exit */
    atomic_llong spin_ns; /* how long workers poll after the current job */
    atomic_ullong no_poll_until_ns; /* see worker_main */
    unsigned long wake_gen; /* under sleep_lock */
    ChunkFn fn;
    const void *ctx;
    int num_workers;
    uint64_t serial_until_ns, backoff_ns; /* under job_lock: see parallel_for */
    long long num_jobs, num_stalls, wait_ns; /* statistics, for info() */
} pool = {.job_lock = PTHREAD_MUTEX_INITIALIZER,
          .sleep_lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Claim and run chunks of the current job until none is left. */
static void run_chunks(void) {
    for (;;) {
        uint64_t c = atomic_load(&pool.claim);
        for (;;) {
            if ((c & 0xffffffffu) >= (c >> 32)) return;
            if (atomic_compare_exchange_weak(&pool.claim, &c, c + 1)) break;
        }
        /* the job cannot change before this chunk is counted done, so fn/ctx are its own */
        pool.fn(pool.ctx, (Py_ssize_t)(c & 0xffffffffu));
        atomic_fetch_add(&pool.done, 1);
    }
}

static int work_pending(void) {
    const uint64_t c = atomic_load(&pool.claim);
    return (c & 0xffffffffu) < (c >> 32);
}

/* Polling between jobs wins on idle cores, but where other processes want them a polling
 * worker takes CPU time from the caller (measured: 2 threads decoded at 59 tok/s polling
 * 300 us, 99 polling none, beside one busy process). A worker that finds it was
 * descheduled mid-poll therefore stops polling, for every worker, for NO_POLL_NS. */
static void *worker_main(void *arg) {
    const int epoch = (int)(intptr_t)arg;
    while (atomic_load(&pool.epoch) == epoch) {
        const uint64_t start = now_ns();
        uint64_t spin_ns = (uint64_t)atomic_load(&pool.spin_ns), last = start;
        if (start < atomic_load(&pool.no_poll_until_ns)) spin_ns = 0;
        int spins = 0;
        while (!work_pending() && atomic_load(&pool.epoch) == epoch) {
            cpu_relax();
            if (++spins % 256 != 0) continue;
            const uint64_t t = now_ns();
            if (t - last > PREEMPTED_NS) {
                atomic_store(&pool.no_poll_until_ns, t + NO_POLL_NS);
                spin_ns = 0;
            }
            last = t;
            if (t - start >= spin_ns) {
                pthread_mutex_lock(&pool.sleep_lock);
                const unsigned long gen = pool.wake_gen;
                atomic_fetch_add(&pool.sleepers, 1);
                /* seq_cst: either this sees the job or its publisher sees a sleeper */
                while (!work_pending() && gen == pool.wake_gen && atomic_load(&pool.epoch) == epoch)
                    pthread_cond_wait(&pool.wake, &pool.sleep_lock);
                atomic_fetch_sub(&pool.sleepers, 1);
                pthread_mutex_unlock(&pool.sleep_lock);
                break;
            }
        }
        run_chunks();
    }
    return NULL;
}

/* Start num_threads - 1 workers once (again in a forked child). Call under job_lock. */
static void ensure_workers(void) {
    const int want = num_threads - 1 < MAX_WORKERS ? num_threads - 1 : MAX_WORKERS;
    while (pool.num_workers < want) {
        pthread_t thread;
        void *epoch = (void *)(intptr_t)atomic_load(&pool.epoch);
        if (pthread_create(&thread, NULL, worker_main, epoch) != 0) break;
        pthread_detach(thread);
        pool.num_workers++;
    }
}

/* fork(): the child has none of the workers, and takes the pool between jobs. */
static void before_fork(void) {
    pthread_mutex_lock(&pool.job_lock);
    pthread_mutex_lock(&pool.sleep_lock);
}

static void after_fork_in_parent(void) {
    pthread_mutex_unlock(&pool.sleep_lock);
    pthread_mutex_unlock(&pool.job_lock);
}

static void after_fork_in_child(void) {
    pool.num_workers = 0;
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.claim, 0);
    pthread_cond_init(&pool.wake, NULL); /* the parent's sleepers are not waiting here */
    pthread_mutex_unlock(&pool.sleep_lock);
    pthread_mutex_unlock(&pool.job_lock);
}

/* Run fn(ctx, 0..total-1) across the pool; returns when every chunk is done. Workers then
 * poll for spin_ns before sleeping: long after a decode matmul (the next comes within
 * microseconds), zero before BLAS (whose own threads want the cores).
 *
 * When the cores are shared with other busy processes, a worker the OS preempts while it
 * holds a chunk keeps the caller waiting a whole time slice (measured: 2 threads decoded
 * at 64 tok/s where 1 thread did 100, next to one busy process). So a job whose caller
 * waited longer than it worked is taken as a stall, and jobs run on the calling thread
 * alone for a back-off (doubling while stalls recur), then the pool is tried again. */
static void parallel_for(ChunkFn fn, const void *ctx, Py_ssize_t total, long long spin_ns) {
    if (total <= 1 || num_threads <= 1) {
        for (Py_ssize_t i = 0; i < total; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&pool.job_lock);
    const uint64_t start = now_ns();
    if (start < pool.serial_until_ns) {
        for (Py_ssize_t i = 0; i < total; i++) fn(ctx, i);
        pthread_mutex_unlock(&pool.job_lock);
        return;
    }
    ensure_workers();
    pool.fn = fn;
    pool.ctx = ctx;
    atomic_store(&pool.spin_ns, spin_ns);
    atomic_store(&pool.done, 0);
    atomic_store(&pool.claim, (uint64_t)total << 32); /* publishes fn and ctx */
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.sleep_lock);
        pool.wake_gen++;
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
    }
    run_chunks();
    const uint64_t worked = now_ns();
    for (int spins = 1; atomic_load(&pool.done) < total; spins++) {
        cpu_relax();
        if (spins % 1024 == 0) sched_yield(); /* let a preempted worker on this core run */
    }
    const uint64_t end = now_ns(), waited = end - worked;
    pool.num_jobs++;
    pool.wait_ns += (long long)waited;
    if (waited > STALL_NS && waited > worked - start) {
        const uint64_t doubled = 2 * pool.backoff_ns;
        pool.backoff_ns = doubled < MIN_BACKOFF_NS   ? MIN_BACKOFF_NS
                          : doubled > MAX_BACKOFF_NS ? MAX_BACKOFF_NS
                                                     : doubled;
        pool.serial_until_ns = end + pool.backoff_ns;
        pool.num_stalls++;
    } else if (pool.backoff_ns && end > pool.serial_until_ns + 4 * pool.backoff_ns) {
        pool.backoff_ns = 0; /* clean for a while: the next stall starts the back-off anew */
    }
    pthread_mutex_unlock(&pool.job_lock);
}
#else
#define SPIN_NS 0
static void parallel_for(ChunkFn fn, const void *ctx, Py_ssize_t total, long long spin_ns) {
    (void)spin_ns;
    for (Py_ssize_t i = 0; i < total; i++) fn(ctx, i);
}
#endif

/* Chunks of about this many multiply-adds: enough to amortise a claim, small enough to
 * balance two threads on a 576-column matrix. */
#define CHUNK_WORK (1 << 16)
#define PANEL_BYTES (1 << 19) /* of x per panel: a quarter of the dev machine's 2 MB L2 */

static Py_ssize_t chunks_of(Py_ssize_t items, Py_ssize_t per_chunk) {
    return (items + per_chunk - 1) / per_chunk;
}

/* -- drivers --------------------------------------------------------------------------- */

/* A job's chunks: row panels of x small enough to stay in L2 while every column of W
 * passes over them (panel-major, so the threads share a panel), each split into runs of
 * columns. */
typedef struct {
    const QMat *w;
    const float *xp; /* x in pack_x's layout */
    float *out;
    Py_ssize_t m, panel_rows;  /* a multiple of MAX_MB */
    Py_ssize_t cols_per_chunk; /* a multiple of COL_TILE */
    Py_ssize_t chunks_per_panel;
    const TileSet *tiles; /* NULL: portable C */
} MatmulJob;

static void matmul_chunk(const void *ctx, Py_ssize_t chunk) {
    const MatmulJob *job = ctx;
    const Py_ssize_t n = job->w->n, m = job->m;
    const Py_ssize_t r0 = chunk / job->chunks_per_panel * job->panel_rows;
    const Py_ssize_t j0 = chunk % job->chunks_per_panel * job->cols_per_chunk;
    const Py_ssize_t r1 = r0 + job->panel_rows < m ? r0 + job->panel_rows : m;
    const Py_ssize_t j1 = j0 + job->cols_per_chunk < n ? j0 + job->cols_per_chunk : n;
    if (job->tiles)
        columns_tiled(job->w, job->xp, job->out, m, r0, r1, j0, j1, job->tiles);
    else
        columns_generic(job->w, job->xp, job->out, m, r0, r1, j0, j1);
}

static const TileSet *tiles_for(int bits) {
#if HAVE_AVX512
    if (isa == ISA_AVX512) return bits == 4 ? TILES512_Q4 : TILES512_Q8;
#endif
#if HAVE_AVX2
    if (isa == ISA_AVX2) return bits == 4 ? TILES256_Q4 : TILES256_Q8;
#endif
    (void)bits;
    return NULL;
}

static void run_matmul(const QMat *w, const float *x, float *out, Py_ssize_t m, float *scratch) {
    pack_x(x, scratch, m, w->k, w->bits);
    Py_ssize_t panel = PANEL_BYTES / (w->k * (Py_ssize_t)sizeof(float)) / MAX_MB * MAX_MB;
    panel = panel < MAX_MB ? MAX_MB : panel > m ? m : panel;
    Py_ssize_t cols = (CHUNK_WORK + panel * w->k - 1) / (panel * w->k);
    cols = (cols + COL_TILE - 1) / COL_TILE * COL_TILE;
    const Py_ssize_t per_panel = chunks_of(w->n, cols);
    const MatmulJob job = {w, scratch, out, m, panel, cols, per_panel, tiles_for(w->bits)};
    /* poll for the next job only when it comes within microseconds (decode, verify): a
     * prefill's matmuls take milliseconds, and BLAS runs attention between them */
    parallel_for(matmul_chunk, &job, chunks_of(m, panel) * per_panel, m <= MAX_MB ? SPIN_NS : 0);
}

typedef struct {
    const QMat *w;
    const int64_t *rows; /* NULL: all rows in order */
    Py_ssize_t count, rows_per_chunk;
    float *out;
} DequantJob;

static void dequant_chunk(const void *ctx, Py_ssize_t chunk) {
    const DequantJob *job = ctx;
    const Py_ssize_t i0 = chunk * job->rows_per_chunk;
    const Py_ssize_t i1 =
        i0 + job->rows_per_chunk < job->count ? i0 + job->rows_per_chunk : job->count;
    for (Py_ssize_t i = i0; i < i1; i++) {
        const Py_ssize_t j = job->rows ? job->rows[i] : i;
        float *dst = job->out + i * job->w->k;
#if HAVE_AVX2
        if (isa != ISA_GENERIC) {
            dequant_row_avx2(job->w, j, dst);
            continue;
        }
#endif
        dequant_row_generic(job->w, j, dst);
    }
}

/* rows[i] of W (all of W when rows is NULL) into out[i, :] */
static void run_dequantize(const QMat *w, const int64_t *rows, Py_ssize_t count, float *out) {
    const Py_ssize_t per_chunk = (4 * CHUNK_WORK + w->k - 1) / w->k; /* dequant is cheap */
    const DequantJob job = {w, rows, count, per_chunk, out};
    parallel_for(dequant_chunk, &job, chunks_of(count, per_chunk), 0);
}

/* -- Python bindings ------------------------------------------------------------------- */

/* Views of the arguments, released together. */
typedef struct {
    Py_buffer views[8];
    int count;
} Views;

static void release_views(Views *v) {
    for (int i = 0; i < v->count; i++) PyBuffer_Release(&v->views[i]);
    v->count = 0;
}

/* A C-contiguous buffer of `ndim` dimensions whose items are of `kind`: 'f' float32,
 * 'p' float32 or float16 (quantization parameters), 'u' uint32, 'i' int64. */
static Py_buffer *get_view(Views *v, PyObject *obj, const char *name, char kind, int ndim,
                           int writable) {
    Py_buffer *view = &v->views[v->count];
    const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return NULL;
    v->count++;
    const char *format = view->format ? view->format : "B";
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') format++;
    const char *accepted = kind == 'f' ? "f" : kind == 'p' ? "fe" : kind == 'u' ? "IL" : "lq";
    const Py_ssize_t itemsize = kind == 'i' ? 8 : kind == 'p' && format[0] == 'e' ? 2 : 4;
    if (view->itemsize != itemsize || strlen(format) != 1 || !strchr(accepted, format[0]) ||
        view->ndim != ndim) {
        const char *what = kind == 'f'   ? "float32"
                           : kind == 'p' ? "float32 or float16"
                           : kind == 'u' ? "uint32"
                                         : "int64";
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous %d-D %s array", name, ndim,
                     what);
        return NULL;
    }
    return view;
}

/* packed, scales, biases, group_size, bits -> QMat with n rows; k from the caller. */
static int get_qmat(Views *v, PyObject *const *args, Py_ssize_t n, Py_ssize_t k, QMat *w) {
    const long group_size = PyLong_AsLong(args[3]), bits = PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return -1;
    if (bits != 4 && bits != 8) {
        PyErr_Format(PyExc_ValueError, "bits must be 4 or 8, not %ld", bits);
        return -1;
    }
    if (group_size <= 0 || group_size % CHUNK || k % group_size) {
        PyErr_Format(PyExc_ValueError,
                     "group_size must be a positive multiple of 32 dividing k=%zd, not %ld", k,
                     group_size);
        return -1;
    }
    Py_buffer *packed = get_view(v, args[0], "packed", 'u', 2, 0);
    if (!packed) return -1;
    Py_buffer *scales = get_view(v, args[1], "scales", 'p', 2, 0);
    if (!scales) return -1;
    Py_buffer *biases = get_view(v, args[2], "biases", 'p', 2, 0);
    if (!biases) return -1;
    if (scales->itemsize != biases->itemsize) {
        PyErr_SetString(PyExc_ValueError, "scales and biases must have one dtype");
        return -1;
    }
    const Py_ssize_t groups = k / group_size;
    if (packed->shape[0] != n || packed->shape[1] * 32 != k * bits || scales->shape[0] != n ||
        scales->shape[1] != groups || biases->shape[0] != n || biases->shape[1] != groups) {
        PyErr_Format(PyExc_ValueError,
                     "quantized shapes do not match [n=%zd, k=%zd] at %ld bits, group %ld", n, k,
                     bits, group_size);
        return -1;
    }
    w->packed = (const uint8_t *)packed->buf;
    w->scales = scales->buf;
    w->biases = biases->buf;
    w->half = scales->itemsize == 2;
    w->n = n;
    w->k = k;
    w->group_size = (int)group_size;
    w->bits = (int)bits;
    return 0;
}

PyDoc_STRVAR(matmul_doc,
             "matmul(x, packed, scales, biases, group_size, bits, out)\n\n"
             "out[m, n] = x[m, k] @ dequantize(W)^T; x and out float32, packed uint32\n"
             "[n, k * bits / 32], scales and biases float32 or float16, all C-contiguous.");

static PyObject *py_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "matmul takes 7 arguments");
        return NULL;
    }
    Views v = {.count = 0};
    QMat w;
    Py_buffer *x = get_view(&v, args[0], "x", 'f', 2, 0);
    Py_buffer *out = x ? get_view(&v, args[6], "out", 'f', 2, 1) : NULL;
    if (!out) goto fail;
    const Py_ssize_t m = x->shape[0], k = x->shape[1], n = out->shape[1];
    if (out->shape[0] != m) {
        PyErr_SetString(PyExc_ValueError, "out must have as many rows as x");
        goto fail;
    }
    if (get_qmat(&v, args + 1, n, k, &w) < 0) goto fail;
    float *scratch = NULL;
    if (m > 0 && !(scratch = alloc_aligned((size_t)(m * k) * sizeof(float)))) {
        PyErr_NoMemory();
        goto fail;
    }
    if (m > 0 && n > 0) {
        Py_BEGIN_ALLOW_THREADS;
        run_matmul(&w, (const float *)x->buf, (float *)out->buf, m, scratch);
        Py_END_ALLOW_THREADS;
    }
    free_aligned(scratch);
    release_views(&v);
    Py_RETURN_NONE;
fail:
    release_views(&v);
    return NULL;
}

/* -- attention for decode-sized rows ---------------------------------------------------
 * out[h, l] = softmax(scale * q[h, l] . k[h/G, :S]^T, masked) @ v[h/G, :S] for the few
 * query rows of a decode or verify step, one (head, row) per chunk. NumPy's batched
 * matmul on the cache's strided views falls back to a slow loop at these sizes. Each row
 * is computed alone, in a fixed order: its result does not depend on how many rows came. */
#define ATTN_MAX_DIM 512 /* head dims the C attention takes */
/* (head, row) pairs x keys from which the pool pays: for one decode row of the default
 * model (9 heads of 64) a short context runs faster on the calling thread alone, a
 * context of ~1k keys faster on two. */
#define ATTN_PARALLEL_KEYS 3072

typedef struct {
    const float *q, *k, *v;
    const uint8_t *mask; /* [L, S] or NULL: every key visible */
    float *out, *scores; /* scores: [Hq * L, S] scratch */
    Py_ssize_t L, S, D, G, k_head, k_row, v_head, v_row;
    float scale;
} AttnJob;

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

/* A float32 3-D view whose last axis is contiguous (the KV cache's [:, :S] slices). */
static Py_buffer *get_rows_view(Views *v, PyObject *obj, const char *name) {
    Py_buffer *view = &v->views[v->count];
    if (PyObject_GetBuffer(obj, view, PyBUF_STRIDES | PyBUF_FORMAT) < 0) return NULL;
    v->count++;
    const char *format = view->format ? view->format : "B";
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') format++;
    if (view->itemsize != 4 || strcmp(format, "f") != 0 || view->ndim != 3 ||
        view->strides[2] != 4 || view->strides[0] % 4 || view->strides[1] % 4 ||
        view->strides[0] < 0 || view->strides[1] < 0) {
        PyErr_Format(PyExc_ValueError, "%s must be a float32 [heads, rows, dim] array whose "
                                       "last axis is contiguous", name);
        return NULL;
    }
    return view;
}

PyDoc_STRVAR(attention_doc,
             "attention(q, k, v, scale, mask, out)\n\n"
             "out[h, l] = softmax(scale * q[h, l] k[h // G]^T) v[h // G] with G = Hq / Hkv;\n"
             "q, out float32 C-contiguous [Hq, L, D]; k, v float32 [Hkv, S, D] with a\n"
             "contiguous last axis; mask None or bool C-contiguous [L, S] (True: visible).");

static PyObject *py_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "attention takes 6 arguments");
        return NULL;
    }
    Views v = {.count = 0};
    float *scores = NULL;
    const double scale = PyFloat_AsDouble(args[3]);
    if (scale == -1.0 && PyErr_Occurred()) return NULL;
    Py_buffer *q = get_view(&v, args[0], "q", 'f', 3, 0);
    Py_buffer *out = q ? get_view(&v, args[5], "out", 'f', 3, 1) : NULL;
    Py_buffer *k = out ? get_rows_view(&v, args[1], "k") : NULL;
    Py_buffer *val = k ? get_rows_view(&v, args[2], "v") : NULL;
    if (!val) goto fail;
    const Py_ssize_t Hq = q->shape[0], L = q->shape[1], D = q->shape[2];
    const Py_ssize_t Hkv = k->shape[0], S = k->shape[1];
    if (k->shape[2] != D || val->shape[0] != Hkv || val->shape[1] != S || val->shape[2] != D ||
        out->shape[0] != Hq || out->shape[1] != L || out->shape[2] != D || Hkv == 0 ||
        Hq % Hkv) {
        PyErr_SetString(PyExc_ValueError, "attention: q, k, v and out shapes do not agree");
        goto fail;
    }
    if (D > ATTN_MAX_DIM) {
        PyErr_Format(PyExc_ValueError, "attention: head dim %zd over %d", D, ATTN_MAX_DIM);
        goto fail;
    }
    const uint8_t *mask = NULL;
    if (args[4] != Py_None) {
        Py_buffer *mv = &v.views[v.count];
        if (PyObject_GetBuffer(args[4], mv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fail;
        v.count++;
        if (mv->itemsize != 1 || mv->ndim != 2 || mv->shape[0] != L || mv->shape[1] != S) {
            PyErr_SetString(PyExc_ValueError, "mask must be a C-contiguous bool [L, S] array");
            goto fail;
        }
        mask = (const uint8_t *)mv->buf;
    }
    if (Hq * L > 0 && S > 0 && !(scores = malloc((size_t)(Hq * L * S) * sizeof(float)))) {
        PyErr_NoMemory();
        goto fail;
    }
    AttnJob job = {(const float *)q->buf, (const float *)k->buf, (const float *)val->buf,
                   mask, (float *)out->buf, scores, L, S, D, Hq / Hkv,
                   k->strides[0] / 4, k->strides[1] / 4, val->strides[0] / 4,
                   val->strides[1] / 4, (float)scale};
    if (S == 0) {
        memset(out->buf, 0, (size_t)(Hq * L * D) * sizeof(float));
    } else if (Hq * L > 0) {
        Py_BEGIN_ALLOW_THREADS;
        if (Hq * L * S >= ATTN_PARALLEL_KEYS) {
            parallel_for(attention_chunk, &job, Hq * L, SPIN_NS);
        } else { /* a short context: waking a worker costs more than it saves */
            for (Py_ssize_t i = 0; i < Hq * L; i++) attention_chunk(&job, i);
        }
        Py_END_ALLOW_THREADS;
    }
    free(scores);
    release_views(&v);
    Py_RETURN_NONE;
fail:
    free(scores);
    release_views(&v);
    return NULL;
}

PyDoc_STRVAR(dequantize_doc,
             "dequantize(packed, scales, biases, group_size, bits, out, rows=None)\n\n"
             "out[i, :] = dequantize(W)[rows[i], :] (all rows when rows is None); rows int64.");

static PyObject *py_dequantize(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "dequantize takes 6 or 7 arguments");
        return NULL;
    }
    Views v = {.count = 0};
    QMat w;
    Py_buffer *out = get_view(&v, args[5], "out", 'f', 2, 1);
    if (!out) goto fail;
    Py_buffer *packed = get_view(&v, args[0], "packed", 'u', 2, 0);
    if (!packed) goto fail;
    const Py_ssize_t n = packed->shape[0], k = out->shape[1];
    if (get_qmat(&v, args, n, k, &w) < 0) goto fail;
    const int64_t *rows = NULL;
    Py_ssize_t count = n;
    if (nargs == 7 && args[6] != Py_None) {
        Py_buffer *ids = get_view(&v, args[6], "rows", 'i', 1, 0);
        if (!ids) goto fail;
        rows = (const int64_t *)ids->buf;
        count = ids->shape[0];
        for (Py_ssize_t i = 0; i < count; i++) {
            if (rows[i] < 0 || rows[i] >= n) {
                PyErr_Format(PyExc_IndexError, "row %lld out of range for %zd rows",
                             (long long)rows[i], n);
                goto fail;
            }
        }
    }
    if (out->shape[0] != count) {
        PyErr_SetString(PyExc_ValueError, "out must have one row per requested row");
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS;
    run_dequantize(&w, rows, count, (float *)out->buf);
    Py_END_ALLOW_THREADS;
    release_views(&v);
    Py_RETURN_NONE;
fail:
    release_views(&v);
    return NULL;
}

static PyObject *py_set_num_threads(PyObject *self, PyObject *arg) {
    (void)self;
    const long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "the thread count must be at least 1");
        return NULL;
    }
#if HAVE_THREADS
    pthread_mutex_lock(&pool.job_lock);
    if (n != num_threads) { /* retire the workers; the next job starts n - 1 fresh ones */
        num_threads = (int)n;
        atomic_fetch_add(&pool.epoch, 1);
        pool.num_workers = 0;
        pthread_mutex_lock(&pool.sleep_lock);
        pool.wake_gen++;
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
    }
    pthread_mutex_unlock(&pool.job_lock);
#endif
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLong(num_threads);
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    for (int i = 0; i <= ISA_AVX512; i++) {
        const int built = i == ISA_GENERIC || (i == ISA_AVX2 && HAVE_AVX2) ||
                          (i == ISA_AVX512 && HAVE_AVX512);
        if (strcmp(name, ISA_NAMES[i]) == 0 && built) {
            isa = i;
            Py_RETURN_NONE;
        }
    }
    PyErr_Format(PyExc_ValueError, "code path %R is not built", arg);
    return NULL;
}

static PyObject *py_info(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *built = Py_BuildValue("[s]", ISA_NAMES[ISA_GENERIC]);
    if (!built) return NULL;
    for (int i = ISA_AVX2; i <= ISA_AVX512; i++) {
        if ((i == ISA_AVX2 && HAVE_AVX2) || (i == ISA_AVX512 && HAVE_AVX512)) {
            PyObject *name = PyUnicode_FromString(ISA_NAMES[i]);
            if (!name || PyList_Append(built, name) < 0) {
                Py_XDECREF(name);
                Py_DECREF(built);
                return NULL;
            }
            Py_DECREF(name);
        }
    }
#if HAVE_THREADS
    const long long jobs = pool.num_jobs, stalls = pool.num_stalls, wait_ns = pool.wait_ns;
#else
    const long long jobs = 0, stalls = 0, wait_ns = 0;
#endif
    return Py_BuildValue("{s:s,s:N,s:O,s:i,s:L,s:L,s:L}", "isa", ISA_NAMES[isa], "built", built,
                         "threads", HAVE_THREADS ? Py_True : Py_False, "num_threads",
                         num_threads, "parallel_jobs", jobs, "stalls", stalls, "wait_ns",
                         wait_ns);
}

static PyMethodDef methods[] = {
    {"matmul", (PyCFunction)(void (*)(void))py_matmul, METH_FASTCALL, matmul_doc},
    {"dequantize", (PyCFunction)(void (*)(void))py_dequantize, METH_FASTCALL, dequantize_doc},
    {"attention", (PyCFunction)(void (*)(void))py_attention, METH_FASTCALL, attention_doc},
    {"set_num_threads", py_set_num_threads, METH_O, "Threads for later calls (1 where built without threads)."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "Threads calls use."},
    {"set_isa", py_set_isa, METH_O, "Use one built code path: 'avx512', 'avx2' or 'generic'."},
    {"info", py_info, METH_NOARGS,
     "Code paths (isa in use, built), threads, and pool statistics (parallel_jobs, stalls,\n"
     "wait_ns: time callers waited on workers)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_qmatmul", "Matrix products against packed quantized weights.",
    -1, methods, NULL, NULL, NULL, NULL};

/* Bumped whenever an entry point's arguments change; kernels/qmatmul.py checks it. */
#define ABI_VERSION 1

PyMODINIT_FUNC PyInit__qmatmul(void) {
#if HAVE_THREADS
    static int registered = 0;
    if (!registered && pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child))
        return PyErr_Format(PyExc_RuntimeError, "pthread_atfork failed");
    registered = 1;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "ABI_VERSION", ABI_VERSION) < 0) Py_CLEAR(m);
    return m;
}
