/* Matrix products against MLX affine-quantized weights, without dequantizing them first.
 *
 * Layout (MLX's, see kernels/quantized.py QuantizedWeight): W is [n, k]; row j is packed
 * into k * bits / 8 little-endian bytes, element i of a row at bits (i % (8 / bits)) * bits
 * of byte i / (8 / bits); each run of group_size elements has a scale and a bias (float32, or
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
 * (most x86 machines without AVX-512) and portable C. kernels/qmatmul_ref.py holds the
 * plain NumPy reference all three are tested against. Work is split over output columns (and,
 * for many rows, cache-sized panels of x) by a small thread pool built for decode's
 * ~120 short calls per token on cores other processes may share (pool.c).
 *
 * Other widths (2, 3, 5, 6 bits) and groups of 16 (GGUF's K-quants) take matmul_any.c's
 * tiles, which unpack each chunk from the bit stream; the drivers here serve both.
 *
 * Sections: x preparation, portable C, AVX-512, AVX2, drivers.
 */
#include "qmatmul.h"

#include <math.h>

int isa = HAVE_AVX512 ? ISA_AVX512 : HAVE_AVX2 ? ISA_AVX2 : ISA_GENERIC;

#define COL_TILE 4     /* output columns a tile set covers (a multiple of every tile's) */
#define GROUP_BLOCK 64 /* groups whose scales and biases a tile converts at a time */

/* -- x preparation --------------------------------------------------------------------- */

/* Cache-line aligned: a 64-byte load that straddles two lines costs two (measured: the
 * 8-row tile ran at 50 instead of 85 GMAC/s on a 16-byte aligned x). */
void *alloc_aligned(size_t size) {
#ifdef _WIN32
    return _aligned_malloc(size, 64);
#else
    return aligned_alloc(64, (size + 63) / 64 * 64);
#endif
}

void free_aligned(void *p) {
#ifdef _WIN32
    _aligned_free(p);
#else
    free(p);
#endif
}

/* x [m, k] as the kernels read it: in blocks of MAX_MB rows (the last may be shorter),
 * each block chunk-major, [chunk][row][32], so a register tile finds its rows' chunks at
 * fixed offsets from one pointer; for 4 bits each chunk is [even 16 | odd 16] to match
 * the nibble order (the 4-bit tiles only). Block b starts at xp + b * MAX_MB * k. */
static void pack_x(const float *x, float *xp, Py_ssize_t m, Py_ssize_t k, int nibbles) {
    for (Py_ssize_t r0 = 0; r0 < m; r0 += MAX_MB) {
        const Py_ssize_t mb = m - r0 < MAX_MB ? m - r0 : MAX_MB;
        for (Py_ssize_t c = 0; c < k / CHUNK; c++) {
            for (Py_ssize_t r = 0; r < mb; r++) {
                const float *src = x + (r0 + r) * k + c * CHUNK;
                float *dst = xp + r0 * k + (c * mb + r) * CHUNK;
                for (int i = 0; i < CHUNK / 2; i++) {
                    dst[i] = nibbles ? src[2 * i] : src[i];
                    dst[CHUNK / 2 + i] = nibbles ? src[2 * i + 1] : src[CHUNK / 2 + i];
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
                d[2 * i] = fmaf(s, (float)(q[i] & 15), b);
                d[2 * i + 1] = fmaf(s, (float)(q[i] >> 4), b);
            }
        } else {
            const uint8_t *q = p + g * w->group_size;
            for (int i = 0; i < w->group_size; i++) d[i] = fmaf(s, (float)q[i], b);
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
    if (!is_nibble_or_byte(job->w))
        columns_any(job->w, job->xp, job->out, m, r0, r1, j0, j1);
    else if (job->tiles)
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

void run_matmul(const QMat *w, const float *x, float *out, Py_ssize_t m, float *scratch) {
    pack_x(x, scratch, m, w->k, w->bits == 4 && is_nibble_or_byte(w));
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
        if (!is_nibble_or_byte(job->w)) {
            dequant_row_any(job->w, j, dst);
            continue;
        }
#if HAVE_AVX2
        if (isa != ISA_GENERIC) {
            dequant_row_avx2(job->w, j, dst);
            continue;
        }
#endif
        dequant_row_generic(job->w, j, dst);
    }
}

void run_dequantize(const QMat *w, const int64_t *rows, Py_ssize_t count, float *out) {
    const Py_ssize_t per_chunk = (4 * CHUNK_WORK + w->k - 1) / w->k; /* dequant is cheap */
    const DequantJob job = {w, rows, count, per_chunk, out};
    parallel_for(dequant_chunk, &job, chunks_of(count, per_chunk), 0);
}
