/* What the attention files share: the split into key blocks, one pass's partials, the
 * row, mask and K/V accessors, and each file's tiles for attention.c to call.
 *
 *   attention.c          the two passes (blocks, merge), portable and AVX-512 decode tiles
 *   attention_avx2.c     AVX2 decode tiles
 *   attention_prefill.c  AVX-512 tiles for a prefill chunk's many rows */
#ifndef BRANCHCHAT_ATTENTION_H
#define BRANCHCHAT_ATTENTION_H

#include "qmatmul.h"

#include <math.h>
#include <string.h>

#define ATTN_BLOCK 64  /* keys per unit of work: fixed, so a row's sums never depend on the split */
#define ATTN_TILE 16   /* keys converted and scored together (one AVX-512 register of scores) */
#define ATTN_ROWS 64   /* decode tiles: query rows scored per pass over a tile of keys */
#define ATTN_CHUNK_L 32 /* query rows per head per pass: bounds the partials' memory */
/* Above this many rows per head (a prefill chunk; decode and verify rows stay below) the
 * prefill tiles serve head dims that are multiples of 64 up to ATTN_PREFILL_DIM. */
#define ATTN_MANY_ROWS 64
#define ATTN_PREFILL_DIM 256
/* A prefill chunk's rows over this many key blocks at most fold into one partial: 1024
 * keys, a sixteenth of the partials' memory and merge of one per block. */
#define ATTN_PREFILL_SPAN 16
#define ATTN_CHUNK_L_PREFILL 256 /* query rows per head per pass, prefill tiles */
/* rows x keys from which the pool pays: one decode row of the default model (9 heads of
 * 64) at a short context runs faster on the calling thread alone */
#define ATTN_PARALLEL_KEYS 3072
/* Up to this many key blocks (a verify's or a short prefill piece's), a kv head's rows go
 * to the pool in groups of ATTN_GROUP_ROWS, each with its every block and its merges */
#define ATTN_GROUP_BLOCKS 8
#define ATTN_GROUP_ROWS 8
/* the tiles' mask loads need AVX-512 BW and VL beside F */
#if HAVE_AVX512 && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ATTN_AVX512 1
#else
#define ATTN_AVX512 0
#endif

typedef struct {
    const AttnJob *job;
    Py_ssize_t l0, lc;         /* this pass's query rows [l0, l0 + lc) of each head */
    Py_ssize_t first_block;    /* key_lo's block: the blocks before it are seen by no row */
    Py_ssize_t num_blocks;     /* partials per row: blocks from first_block, over span */
    Py_ssize_t span;           /* key blocks per partial: 1, or more for a prefill chunk */
    float *m, *sum, *acc;      /* partials of row R = h * lc + (l - l0), block b at R * num_blocks + b */
    int simd;                  /* the AVX-512 tiles (D a multiple of 16) */
    int avx2;                  /* else attention_avx2.c's (D a multiple of 8), else portable C */
    int many;                  /* a prefill chunk's rows: attention_prefill.c's tiles */
} AttnRun;

static inline const float *q_row(const AttnRun *run, Py_ssize_t R) {
    const AttnJob *j = run->job;
    const Py_ssize_t h = R / run->lc, l = run->l0 + R % run->lc;
    return j->q + (h * j->L + l) * j->D;
}

static inline const uint8_t *mask_row(const AttnRun *run, Py_ssize_t R) {
    const AttnJob *j = run->job;
    return j->mask ? j->mask + (run->l0 + R % run->lc) * j->S : NULL;
}

/* Whether any of keys [s0, s0 + n) is visible to the row. */
static inline int any_visible(const uint8_t *mask, Py_ssize_t s0, Py_ssize_t n) {
    if (!mask) return 1;
    for (Py_ssize_t s = s0; s < s0 + n; s++)
        if (mask[s]) return 1;
    return 0;
}

/* Rows [R0, R0 + num_rows) of a block over keys [s0, s0 + n): their queries, masks and
 * whether each sees a key there (a row that sees none gets partial max -inf in block b);
 * how many do. Both code paths' block kernels start here. */
static inline int block_rows_setup(const AttnRun *run, Py_ssize_t s0, Py_ssize_t n,
                                   Py_ssize_t R0, Py_ssize_t num_rows, Py_ssize_t b,
                                   const float **q, const uint8_t **masks, int *live) {
    int num_live = 0;
    for (Py_ssize_t r = 0; r < num_rows; r++) {
        q[r] = q_row(run, R0 + r);
        masks[r] = mask_row(run, R0 + r);
        live[r] = any_visible(masks[r], s0, n);
        num_live += live[r];
        if (!live[r]) run->m[(R0 + r) * run->num_blocks + b] = -INFINITY;
    }
    return num_live;
}

/* Row s of kv head g of K (is_v 0) or V (1) as float32: in place, or converted into dst;
 * a ring's key s from its slot, or from the call's own rows. */
static inline const float *kv_row(const AttnJob *j, int is_v, Py_ssize_t g, Py_ssize_t s,
                                  float *dst) {
    const void *base = is_v ? j->v : j->k;
    Py_ssize_t at;
    if (j->ring_rows && s >= j->first_new) {
        base = is_v ? j->new_v : j->new_k;
        at = g * j->new_head + (s - j->first_new) * j->D;
    } else {
        const Py_ssize_t row = j->ring_rows ? s % j->ring_rows : s;
        at = g * (is_v ? j->v_head : j->k_head) + row * (is_v ? j->v_row : j->k_row);
    }
    if (!j->kv_half) return (const float *)base + at;
    const uint16_t *h = (const uint16_t *)base + at;
    Py_ssize_t d = 0;
#if defined(__AVX512F__)
    for (; d + 16 <= j->D; d += 16)
        _mm512_storeu_ps(dst + d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + d))));
#endif
#if defined(__F16C__)
    for (; d + 8 <= j->D; d += 8)
        _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + d))));
#endif
    for (; d < j->D; d++) dst[d] = half_to_float(h[d]);
    return dst;
}

#if ATTN_AVX512
/* e^x for x <= 0 (Cephes' expf: x = n ln2 + r, a degree-7 polynomial in r, then 2^n);
 * within 2 ulp, and 0 below -104 where e^x is under float's smallest subnormal. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(p, n);
}

/* A row's block of scores (num_tiles x 16, masked keys -inf, at least one not) in place
 * into p_j = exp(s_j - m) against the running max *m (-inf: none yet), raised to the
 * block's max first; returns sum_j p_j (masked keys: exactly 0). */
static inline float softmax_tiles(float *sc, Py_ssize_t num_tiles, float *m) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    __m512 mv = neg_inf, total = _mm512_setzero_ps();
    for (Py_ssize_t t = 0; t < num_tiles; t++) mv = _mm512_max_ps(mv, _mm512_load_ps(sc + 16 * t));
    const float block_max = _mm512_reduce_max_ps(mv);
    if (block_max > *m) *m = block_max;
    mv = _mm512_set1_ps(*m);
    for (Py_ssize_t t = 0; t < num_tiles; t++) {
        const __m512 s = _mm512_load_ps(sc + 16 * t);
        const __mmask16 seen = _mm512_cmp_ps_mask(s, neg_inf, _CMP_NEQ_OQ);
        const __m512 p = _mm512_maskz_mov_ps(seen, exp512(_mm512_sub_ps(s, mv)));
        total = _mm512_add_ps(total, p);
        _mm512_store_ps(sc + 16 * t, p);
    }
    return _mm512_reduce_add_ps(total);
}

/* Rows [R0, R0 + num_rows) of kv head g (a prefill chunk's) over the span of key blocks of
 * partial p, folded into one partial per row: attention_prefill.c. */
void span_prefill(const AttnRun *run, Py_ssize_t g, Py_ssize_t p, Py_ssize_t R0,
                  Py_ssize_t num_rows);
#endif

#if HAVE_AVX2
/* Partials of rows [R0, R0 + num_rows) of kv head g over keys [s0, s0 + n) (block b): the
 * AVX2 decode tiles, attention_avx2.c. */
void block_rows_avx2(const AttnRun *run, Py_ssize_t g, Py_ssize_t s0, Py_ssize_t n,
                     Py_ssize_t R0, Py_ssize_t num_rows, Py_ssize_t b);
#endif

#endif /* BRANCHCHAT_ATTENTION_H */
