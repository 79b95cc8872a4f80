/* Products against quantized weights of any width (2, 3, 4, 5, 6, 8 bits) and groups of
 * 16 or a multiple of 32: what GGUF's K-quants and Q5_0/Q5_1 convert to
 * (kernels/gguf_quants.py). matmul.c's 4/8-bit tiles keep their own faster paths.
 *
 * Layout (MLX's): element i of a row sits at bits [i * bits, (i + 1) * bits) of the row's
 * little-endian bit stream, so a 32-element chunk is 4 * bits bytes and 8 elements are
 * `bits` whole bytes. A chunk's two halves of 16 have their own group when groups are
 * 16, else share one. SIMD unpacking takes 8 elements at a time: load their `bits` bytes,
 * one byte shuffle puts each element's two bytes in a 16-bit lane, widen to 32 bits,
 * shift each lane right by its bit offset and mask. Each weight is then scale * q + bias
 * by one FMA (one rounding, as gguf-py's float32 dequantization has), and x (pack_x's
 * layout, element order) is multiplied as in matmul.c.
 *
 * Sections: unpacking, portable C, AVX-512, AVX2, dispatch.
 */
#include "qmatmul.h"

#include <math.h>

/* -- unpacking ------------------------------------------------------------------------- */

/* The 8 bytes from q, zero past `end` (the last row's last chunk must not read beyond
 * the matrix). */
static inline uint64_t load8(const uint8_t *q, const uint8_t *end) {
    uint64_t v = 0;
    if (__builtin_expect(q + 8 <= end, 1))
        memcpy(&v, q, 8); /* one load: a constant size */
    else
        memcpy(&v, q, (size_t)(end - q));
    return v;
}

static inline const uint8_t *matrix_end(const QMat *w) {
    return w->packed + w->n * (w->k * w->bits / 8);
}

static inline float param(const QMat *w, const void *a, Py_ssize_t i) {
    return w->half ? half_to_float(((const uint16_t *)a)[i]) : ((const float *)a)[i];
}

/* The scale and bias of each half of chunk c of row j: s[0], b[0] for elements 0-15.
 * Groups of 16: groups 2c and 2c + 1; else both halves in group c / (group_size / 32),
 * a shift (group sizes of 32 * 2^n, all GGUF and MLX have) or a division. */
static inline void chunk_params(const QMat *w, Py_ssize_t j, Py_ssize_t c, float s[2],
                                float b[2]) {
    const Py_ssize_t groups = w->k / w->group_size, row = j * groups;
    Py_ssize_t g0, g1;
    if (w->group_size == 16) {
        g0 = 2 * c, g1 = 2 * c + 1;
    } else {
        const int per = w->group_size / CHUNK;
        g0 = g1 = (per & (per - 1)) == 0 ? c >> __builtin_ctz((unsigned)per) : c / per;
    }
    s[0] = param(w, w->scales, row + g0), b[0] = param(w, w->biases, row + g0);
    s[1] = param(w, w->scales, row + g1), b[1] = param(w, w->biases, row + g1);
}

/* -- portable C ------------------------------------------------------------------------ */

static void unpack_chunk(const uint8_t *q, int bits, uint8_t out[CHUNK]) {
    const unsigned mask = (1u << bits) - 1;
    for (int i = 0; i < CHUNK; i++) {
        const int bit = i * bits, byte = bit >> 3, shift = bit & 7;
        unsigned v = q[byte];
        if (shift + bits > 8) v |= (unsigned)q[byte + 1] << 8;
        out[i] = (uint8_t)((v >> shift) & mask);
    }
}

static void dequant_chunk_generic(const QMat *w, Py_ssize_t j, Py_ssize_t c, float *dst) {
    uint8_t q[CHUNK];
    float s[2], b[2];
    unpack_chunk(row_bytes(w, j) + c * (CHUNK * w->bits / 8), w->bits, q);
    chunk_params(w, j, c, s, b);
    for (int i = 0; i < CHUNK; i++) dst[i] = fmaf(s[i / 16], (float)q[i], b[i / 16]);
}

static void columns_any_generic(const QMat *w, const float *xp, float *out, Py_ssize_t m,
                                Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t j0, Py_ssize_t j1) {
    const Py_ssize_t chunks = w->k / CHUNK;
    for (Py_ssize_t j = j0; j < j1; j++) {
        for (Py_ssize_t r = r0; r < r1; r++) {
            const Py_ssize_t blk = r - r % MAX_MB, mb = m - blk < MAX_MB ? m - blk : MAX_MB;
            const float *xr = xp + blk * w->k + (r - blk) * CHUNK;
            float acc[CHUNK] = {0}, wc[CHUNK];
            for (Py_ssize_t c = 0; c < chunks; c++) {
                dequant_chunk_generic(w, j, c, wc);
                const float *xc = xr + c * mb * CHUNK;
                for (int i = 0; i < CHUNK; i++) acc[i] += wc[i] * xc[i];
            }
            float total = 0.0f;
            for (int i = 0; i < CHUNK; i++) total += acc[i];
            out[r * w->n + j] = total;
        }
    }
}

/* -- SIMD unpacking tables ------------------------------------------------------------- */
#if HAVE_AVX2

/* For 8 elements of `bits` bits: lane i's two source bytes (0x80: none) and bit shift. */
typedef struct {
    __m128i shuffle;
    __m256i shifts, mask;
} Unpack8;

static Unpack8 unpack8_for(int bits) {
    uint8_t shuffle[16];
    int32_t shifts[8];
    for (int i = 0; i < 8; i++) {
        const int bit = i * bits, byte = bit >> 3;
        shuffle[2 * i] = (uint8_t)byte;
        shuffle[2 * i + 1] = byte + 1 < 8 ? (uint8_t)(byte + 1) : 0x80;
        shifts[i] = bit & 7;
    }
    Unpack8 u;
    u.shuffle = _mm_loadu_si128((const __m128i *)shuffle);
    u.shifts = _mm256_loadu_si256((const __m256i *)shifts);
    u.mask = _mm256_set1_epi32((1 << bits) - 1);
    return u;
}

/* 8 codes as int32 lanes from their `bits` bytes at q. */
static inline __m256i unpack8(const Unpack8 *u, const uint8_t *q, const uint8_t *end) {
    const __m128i raw = _mm_cvtsi64_si128((long long)load8(q, end));
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_shuffle_epi8(raw, u->shuffle));
    return _mm256_and_si256(_mm256_srlv_epi32(wide, u->shifts), u->mask);
}

/* Chunk c of row j dequantized into four 8-lane vectors, in element order. */
static inline void dequant_chunk256(const QMat *w, const Unpack8 *u, Py_ssize_t j,
                                    Py_ssize_t c, const uint8_t *end, __m256 wv[4]) {
    const uint8_t *q = row_bytes(w, j) + c * (CHUNK * w->bits / 8);
    float s[2], b[2];
    chunk_params(w, j, c, s, b);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m256 qf = _mm256_cvtepi32_ps(unpack8(u, q + v * w->bits, end));
        wv[v] = _mm256_fmadd_ps(qf, _mm256_set1_ps(s[v / 2]), _mm256_set1_ps(b[v / 2]));
    }
}
#endif /* HAVE_AVX2 */

/* -- AVX-512 --------------------------------------------------------------------------- */
#if HAVE_AVX512

/* One column of W against MB rows of x: each chunk is unpacked 16 lanes at a time (two
 * groups of 8 side by side; the byte shuffle works per 128-bit lane) and reused by the
 * MB rows. MB is a compile-time constant at each use. */
static inline __attribute__((always_inline)) void
column512(const QMat *w, const Unpack8 *u, const float *xr, float *out, Py_ssize_t j,
          const int MB) {
    const Py_ssize_t chunks = w->k / CHUNK;
    const uint8_t *end = matrix_end(w), *p = row_bytes(w, j);
    const __m256i shuffle = _mm256_broadcastsi128_si256(u->shuffle);
    const __m512i shifts = _mm512_broadcast_i64x4(u->shifts);
    const __m512i mask = _mm512_set1_epi32((1 << w->bits) - 1);
    __m512 acc[MAX_MB][2]; /* the halves apart: two FMA chains hide the latency */
#pragma GCC unroll 8
    for (int r = 0; r < MB; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (Py_ssize_t c = 0; c < chunks; c++) {
        const uint8_t *q = p + c * (CHUNK * w->bits / 8);
        float s[2], b[2];
        chunk_params(w, j, c, s, b);
        __m512 half[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const uint8_t *qh = q + 2 * h * w->bits;
            const __m256i raw = _mm256_set_m128i(_mm_cvtsi64_si128((long long)load8(qh + w->bits, end)),
                                                 _mm_cvtsi64_si128((long long)load8(qh, end)));
            const __m512i wide = _mm512_cvtepu16_epi32(_mm256_shuffle_epi8(raw, shuffle));
            const __m512i codes = _mm512_and_si512(_mm512_srlv_epi32(wide, shifts), mask);
            half[h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(codes), _mm512_set1_ps(s[h]),
                                      _mm512_set1_ps(b[h]));
        }
        const float *xc = xr + c * (MB * CHUNK);
#pragma GCC unroll 8
        for (int r = 0; r < MB; r++) {
            acc[r][0] = _mm512_fmadd_ps(half[0], _mm512_loadu_ps(xc + r * CHUNK), acc[r][0]);
            acc[r][1] =
                _mm512_fmadd_ps(half[1], _mm512_loadu_ps(xc + r * CHUNK + 16), acc[r][1]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MB; r++)
        out[r * w->n + j] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}
#endif /* HAVE_AVX512 */

/* -- AVX2 ------------------------------------------------------------------------------ */
#if HAVE_AVX2

static inline __attribute__((always_inline)) void
column256(const QMat *w, const Unpack8 *u, const float *xr, float *out, Py_ssize_t j,
          const int MB) {
    const Py_ssize_t chunks = w->k / CHUNK;
    const uint8_t *end = matrix_end(w);
    __m256 acc[MAX_MB][2];
#pragma GCC unroll 8
    for (int r = 0; r < MB; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (Py_ssize_t c = 0; c < chunks; c++) {
        __m256 wv[4];
        dequant_chunk256(w, u, j, c, end, wv);
        const float *xc = xr + c * (MB * CHUNK);
#pragma GCC unroll 8
        for (int r = 0; r < MB; r++)
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                acc[r][v % 2] =
                    _mm256_fmadd_ps(wv[v], _mm256_loadu_ps(xc + r * CHUNK + 8 * v), acc[r][v % 2]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MB; r++) {
        const __m256 a = _mm256_add_ps(acc[r][0], acc[r][1]);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        out[r * w->n + j] = _mm_cvtss_f32(h);
    }
}

/* One instance per block height: the constant MB unrolls the row loops. */
#define COLUMN_CASES(FN)                                                                    \
    switch (mb) {                                                                           \
    case 1: FN(w, u, xr, o, j, 1); break;                                                   \
    case 2: FN(w, u, xr, o, j, 2); break;                                                   \
    case 3: FN(w, u, xr, o, j, 3); break;                                                   \
    case 4: FN(w, u, xr, o, j, 4); break;                                                   \
    case 5: FN(w, u, xr, o, j, 5); break;                                                   \
    case 6: FN(w, u, xr, o, j, 6); break;                                                   \
    case 7: FN(w, u, xr, o, j, 7); break;                                                   \
    default: FN(w, u, xr, o, j, 8); break;                                                  \
    }

static void columns_any_simd(const QMat *w, const float *xp, float *out, Py_ssize_t m,
                             Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t j0, Py_ssize_t j1) {
    const Unpack8 unpack = unpack8_for(w->bits), *u = &unpack;
    for (Py_ssize_t r = r0; r < r1; r += MAX_MB) {
        const Py_ssize_t mb = m - r < MAX_MB ? m - r : MAX_MB;
        const float *xr = xp + r * w->k;
        float *o = out + r * w->n;
        for (Py_ssize_t j = j0; j < j1; j++) {
#if HAVE_AVX512
            if (isa == ISA_AVX512) {
                COLUMN_CASES(column512)
                continue;
            }
#endif
            COLUMN_CASES(column256)
        }
    }
}
#endif /* HAVE_AVX2 */

/* -- dispatch -------------------------------------------------------------------------- */

void columns_any(const QMat *w, const float *xp, float *out, Py_ssize_t m, Py_ssize_t r0,
                 Py_ssize_t r1, Py_ssize_t j0, Py_ssize_t j1) {
#if HAVE_AVX2
    if (isa != ISA_GENERIC) {
        columns_any_simd(w, xp, out, m, r0, r1, j0, j1);
        return;
    }
#endif
    columns_any_generic(w, xp, out, m, r0, r1, j0, j1);
}

void dequant_row_any(const QMat *w, Py_ssize_t j, float *dst) {
    const Py_ssize_t chunks = w->k / CHUNK;
#if HAVE_AVX2
    if (isa != ISA_GENERIC) {
        const Unpack8 u = unpack8_for(w->bits);
        const uint8_t *end = matrix_end(w);
        for (Py_ssize_t c = 0; c < chunks; c++) {
            __m256 wv[4];
            dequant_chunk256(w, &u, j, c, end, wv);
            for (int v = 0; v < 4; v++) _mm256_storeu_ps(dst + c * CHUNK + 8 * v, wv[v]);
        }
        return;
    }
#endif
    for (Py_ssize_t c = 0; c < chunks; c++) dequant_chunk_generic(w, j, c, dst + c * CHUNK);
}
