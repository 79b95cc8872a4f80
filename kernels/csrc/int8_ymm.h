/* The ymm code paths of int8_matmul.c, included once per target: with I8_YMM_VNNI 1 under
 * AVX-VNNI (vpdpbusd on ymm), with 0 under plain AVX2 (vpmaddubsw + vpmaddwd). One body
 * for both keeps their arithmetic the same; each inclusion sits inside its own
 * `#pragma GCC target`, so the AVX2 one never holds a VNNI instruction.
 *
 * A ymm holds half of a tile's 64-byte vector: rows 0-7 (bytes 0-31) or 8-15 (32-63), so
 * the unit of work is a half tile of 8 output rows; expects I8_YMM_VNNI and I8_YMM_SUFFIX. */

#define I8_YMM_CAT2(a, b) a##b
#define I8_YMM_CAT(a, b) I8_YMM_CAT2(a, b)
#define I8_YMM(name) I8_YMM_CAT(name, I8_YMM_SUFFIX)

/* acc + the 4-product sums of u8 w and s8 x per int32 lane. Without VNNI, vpmaddubsw's
 * pairs stay in int16 for q < 64 (63 * 127 * 2 < 32767); 8-bit weights go in as their two
 * nibbles, the high one weighted 16 by vpmaddwd. */
static inline __attribute__((always_inline)) __m256i I8_YMM(dot4_)(__m256i acc, __m256i w,
                                                                   __m256i x, const int BITS) {
#if I8_YMM_VNNI
    (void)BITS;
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#else
    if (BITS == 8) {
        const __m256i low4 = _mm256_set1_epi8(15);
        const __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(w, low4), x);
        const __m256i hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w, 4), low4), x);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(lo, _mm256_set1_epi16(1)));
        return _mm256_add_epi32(acc, _mm256_madd_epi16(hi, _mm256_set1_epi16(16)));
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}

/* 32 mask bits as bytes: `add` where the bit is set, else 0 (bit i for byte i). */
static inline __attribute__((always_inline)) __m256i I8_YMM(mask_bytes_)(uint32_t bits, int add) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                            2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i select = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(v, select), select);
    return _mm256_and_si256(set, _mm256_set1_epi8((char)add));
}

/* Half tile u's weights of quads p and p + 1 (rows 8 * (u % 2) of tile u / 2). */
static inline __attribute__((always_inline)) void
I8_YMM(weights_)(const I8Mat *w, Py_ssize_t u, Py_ssize_t p, const int BITS, __m256i *lo,
                 __m256i *hi) {
    const Py_ssize_t quads = w->k / 4, t = u / 2, half = u % 2;
    const uint8_t *qs = w->qs + t * i8_tile_qs_bytes(w) + 32 * half;
    _mm_prefetch((const char *)qs + (BITS == 8 ? p : p / 2) * 64 + I8_PREFETCH, _MM_HINT_T0);
    if (BITS == 8) _mm_prefetch((const char *)qs + (p + 1) * 64 + I8_PREFETCH, _MM_HINT_T0);
    if (BITS == 8) {
        *lo = _mm256_loadu_si256((const __m256i *)(qs + p * 64));
        *hi = _mm256_loadu_si256((const __m256i *)(qs + (p + 1) * 64));
        return;
    }
    const __m256i low4 = _mm256_set1_epi8(15);
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + p / 2 * 64));
    *lo = _mm256_and_si256(raw, low4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    if (BITS >= 5) {
        const uint64_t *hb = w->hbits + t * i8_planes(w) * quads;
        for (int plane = 0; plane < BITS - 4; plane++) {
            const uint64_t *pl = hb + plane * quads;
            *lo = _mm256_or_si256(*lo, I8_YMM(mask_bytes_)((uint32_t)(pl[p] >> (32 * half)), 16 << plane));
            *hi = _mm256_or_si256(*hi, I8_YMM(mask_bytes_)((uint32_t)(pl[p + 1] >> (32 * half)), 16 << plane));
        }
    }
}

static inline __m256 I8_YMM(params_)(const I8Mat *w, const void *a, Py_ssize_t i) {
    return w->half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)a + i)))
                   : _mm256_loadu_ps((const float *)a + i);
}

/* NU half tiles from u against MB rows of x from r; the int8.h arithmetic as tile512's,
 * and its moves: one int32 sum for both quads of a nibble vector, the bias term after the
 * integer pass, so 3 rows of one half tile fit the 16 registers (one level). */
static inline __attribute__((always_inline)) void
I8_YMM(tile_)(const I8Mat *w, const I8X *x, Py_ssize_t r, Py_ssize_t u, float *out, Py_ssize_t ld,
              const int BITS, const int NU, const int MB) {
    const Py_ssize_t k = w->k, groups = k / w->group_size;
    const int LEVELS = i8_levels(BITS);
    const I8Quad *xq[3], *xq2[3];
    const float *d[3], *d2[3], *xb[3];
    __m256 acc_s[2][3], acc_b[2][3];
    for (int i = 0; i < MB; i++) {
        xq[i] = (const I8Quad *)(x->xq + (r + i) * k);
        d[i] = x->d + (r + i) * (k / I8_BLOCK);
        xb[i] = x->xb + (r + i) * groups;
        if (LEVELS == 2) {
            xq2[i] = (const I8Quad *)(x->xq2 + (r + i) * k);
            d2[i] = x->d2 + (r + i) * (k / I8_BLOCK);
        }
        for (int c = 0; c < NU; c++) acc_s[c][i] = acc_b[c][i] = _mm256_setzero_ps();
    }
    for (Py_ssize_t g = 0; g < groups; g++) {
        const Py_ssize_t end = (g + 1) * w->group_size;
        __m256 tsum[2][3];
        for (int c = 0; c < NU; c++)
            for (int i = 0; i < MB; i++) tsum[c][i] = _mm256_setzero_ps();
        for (Py_ssize_t e = g * w->group_size; e < end;) {
            const Py_ssize_t blk = e / I8_BLOCK;
            const Py_ssize_t stop = (blk + 1) * I8_BLOCK < end ? (blk + 1) * I8_BLOCK : end;
            /* a decode row sums the high quads apart: 4 dpbusd chains instead of 2 */
            __m256i isum[2][3], isum_hi[2][3], isum2[2][3];
            for (int c = 0; c < NU; c++)
                for (int i = 0; i < MB; i++)
                    isum[c][i] = isum_hi[c][i] = isum2[c][i] = _mm256_setzero_si256();
            for (Py_ssize_t p = e / 4; p < stop / 4; p += 2) {
                for (int c = 0; c < NU; c++) {
                    __m256i lo, hi;
                    I8_YMM(weights_)(w, u + c, p, BITS, &lo, &hi);
                    for (int i = 0; i < MB; i++) {
                        isum[c][i] = I8_YMM(dot4_)(isum[c][i], lo, _mm256_set1_epi32(xq[i][p]), BITS);
                        const __m256i x_hi = _mm256_set1_epi32(xq[i][p + 1]);
                        if (MB == 1)
                            isum_hi[c][i] = I8_YMM(dot4_)(isum_hi[c][i], hi, x_hi, BITS);
                        else
                            isum[c][i] = I8_YMM(dot4_)(isum[c][i], hi, x_hi, BITS);
                        if (LEVELS == 2) {
                            isum2[c][i] = I8_YMM(dot4_)(isum2[c][i], lo, _mm256_set1_epi32(xq2[i][p]), BITS);
                            isum2[c][i] = I8_YMM(dot4_)(isum2[c][i], hi, _mm256_set1_epi32(xq2[i][p + 1]), BITS);
                        }
                    }
                }
            }
            for (int i = 0; i < MB; i++) {
                const __m256 dv = _mm256_set1_ps(d[i][blk]);
                for (int c = 0; c < NU; c++) {
                    const __m256i sum = MB == 1 ? _mm256_add_epi32(isum[c][i], isum_hi[c][i]) : isum[c][i];
                    tsum[c][i] = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(sum), tsum[c][i]);
                    if (LEVELS == 2)
                        tsum[c][i] = _mm256_fmadd_ps(_mm256_set1_ps(d2[i][blk]),
                                                     _mm256_cvtepi32_ps(isum2[c][i]), tsum[c][i]);
                }
            }
            e = stop;
        }
        for (int c = 0; c < NU; c++) {
            const Py_ssize_t at = ((u + c) / 2 * groups + g) * I8_TILE + 8 * ((u + c) % 2);
            const __m256 sv = I8_YMM(params_)(w, w->scales, at);
            for (int i = 0; i < MB; i++) acc_s[c][i] = _mm256_fmadd_ps(sv, tsum[c][i], acc_s[c][i]);
        }
    }
    for (Py_ssize_t g = 0; g < groups; g++) {
        for (int c = 0; c < NU; c++) {
            const Py_ssize_t at = ((u + c) / 2 * groups + g) * I8_TILE + 8 * ((u + c) % 2);
            const __m256 bv = w->zero ? _mm256_mul_ps(I8_YMM(params_)(w, w->scales, at),
                                                      _mm256_set1_ps((float)-w->zero))
                                      : I8_YMM(params_)(w, w->biases, at);
            for (int i = 0; i < MB; i++)
                acc_b[c][i] = _mm256_fmadd_ps(bv, _mm256_set1_ps(xb[i][g]), acc_b[c][i]);
        }
    }
    for (int c = 0; c < NU; c++) {
        const Py_ssize_t left = w->n - (u + c) * 8;
        if (left <= 0) continue;
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(left < 8 ? (int)left : 8),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int i = 0; i < MB; i++)
            _mm256_maskstore_ps(out + (r + i) * ld + (u + c) * 8, keep,
                                _mm256_add_ps(acc_s[c][i], acc_b[c][i]));
    }
}

/* Rows [r0, r1) x tiles [t0, t1): 2 half tiles x 1 row, or 1 x 2 rows, or 1 x 3 against
 * one level (16 ymm registers). */
static inline __attribute__((always_inline)) void
I8_YMM(rows_)(const I8Mat *w, const I8X *x, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t t0,
              Py_ssize_t t1, float *out, Py_ssize_t ld, const int BITS) {
    const Py_ssize_t most = BITS == 8 ? 2 : 3;
    for (Py_ssize_t r = r0; r < r1;) {
        const Py_ssize_t mb = r1 - r < most ? r1 - r : most;
        for (Py_ssize_t u = 2 * t0; u < 2 * t1; u += 2) {
            if (mb == 1) {
                I8_YMM(tile_)(w, x, r, u, out, ld, BITS, 2, 1);
            } else {
                for (Py_ssize_t v = u; v < u + 2; v++) {
                    if (mb == 3 && BITS != 8) /* mb <= 2 at 8 bits: no such tile */
                        I8_YMM(tile_)(w, x, r, v, out, ld, BITS, 1, 3);
                    else
                        I8_YMM(tile_)(w, x, r, v, out, ld, BITS, 1, 2);
                }
            }
        }
        r += mb;
    }
}

static void I8_YMM(block_)(const I8Mat *w, const I8X *x, Py_ssize_t r0, Py_ssize_t r1,
                           Py_ssize_t t0, Py_ssize_t t1, float *out, Py_ssize_t ld) {
    switch (w->bits) {
    case 8: I8_YMM(rows_)(w, x, r0, r1, t0, t1, out, ld, 8); break;
    case 6: I8_YMM(rows_)(w, x, r0, r1, t0, t1, out, ld, 6); break;
    case 5: I8_YMM(rows_)(w, x, r0, r1, t0, t1, out, ld, 5); break;
    default: I8_YMM(rows_)(w, x, r0, r1, t0, t1, out, ld, 4); break;
    }
}

#undef I8_YMM
#undef I8_YMM_CAT
#undef I8_YMM_CAT2
