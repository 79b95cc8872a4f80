/* What the files of the C kernel kernels._qmatmul share (setup.py builds them into one
 * extension): the code paths this build has, the quantized matrix, and each file's entry
 * points for the others.
 *
 *   matmul.c     products against packed quantized weights, and their dequantization
 *   matmul_any.c the same for any bits and groups of 16
 *   int8_quant.c, int8_matmul.c, int8_module.c (int8.h, int8_ymm.h)
 *                integer dot products against int8-quantized activations, on a weight
 *                layout of their own (kernels/int8_matmul.py wraps them)
 *   attention.c  softmax attention over float32 or float16 K/V rows, any row count
 *                (attention.h: the tiles it shares with attention_avx2.c, _prefill.c)
 *   pool.c       the thread pool they split their work over
 *   module.c     the Python module: argument checks, then a call into the above
 *
 * kernels/qmatmul.py wraps the module; kernels/qmatmul_ref.py holds the plain NumPy
 * definitions every code path is tested against.
 */
#ifndef BRANCHCHAT_QMATMUL_H
#define BRANCHCHAT_QMATMUL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#ifndef _WIN32
#define HAVE_THREADS 1
#else
#define HAVE_THREADS 0
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
extern int isa; /* the code path in use, one of those built (matmul.c) */

#define CHUNK 32 /* elements per unit of work: 16 bytes at 4 bits, 32 at 8 */
#define MAX_MB 8 /* rows of x per register tile */

typedef struct {
    const uint8_t *packed; /* [n, k * bits / 8] */
    const void *scales;    /* [n, k / group_size], float32 or float16 (half) */
    const void *biases;    /* [n, k / group_size], same type */
    Py_ssize_t n, k;
    int group_size, bits, half;
} QMat;

/* Whether W takes the 4/8-bit tiles of matmul.c (else matmul_any.c's: any bits, and
 * groups of 16, which unpack each chunk from the bit stream first). */
static inline int is_nibble_or_byte(const QMat *w) {
    return (w->bits == 4 || w->bits == 8) && w->group_size % CHUNK == 0;
}

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

/* -- matmul.c -------------------------------------------------------------------------- */

/* out[m, n] = x[m, k] @ W^T; scratch: m * k floats from alloc_aligned */
void run_matmul(const QMat *w, const float *x, float *out, Py_ssize_t m, float *scratch);
/* rows[i] of W (all of W when rows is NULL) into out[i, :] */
void run_dequantize(const QMat *w, const int64_t *rows, Py_ssize_t count, float *out);
void *alloc_aligned(size_t size);
/* -- matmul_any.c ----------------------------------------------------------------------- */

/* out[r, j] for rows [r0, r1) and columns [j0, j1) of x in pack_x's layout (element
 * order), W of any bits and group size, on the code path `isa` names */
void columns_any(const QMat *w, const float *xp, float *out, Py_ssize_t m, Py_ssize_t r0,
                 Py_ssize_t r1, Py_ssize_t j0, Py_ssize_t j1);
/* W row j into dst in element order */
void dequant_row_any(const QMat *w, Py_ssize_t j, float *dst);

void free_aligned(void *p);

/* -- attention.c ----------------------------------------------------------------------- */

#define ATTN_MAX_DIM 512 /* head dims the C attention takes */

/* out[h, l] = softmax(scale * q[h, l] . k[h / G]^T, masked) @ v[h / G] for query heads
 * h < Hq = G * Hkv. K and V are rows of the KV cache's [Hkv, capacity, D] buffers read in
 * place: float16 when kv_half, else float32, strides counted in elements of that type (the
 * last axis contiguous). Callers on other threads (the C decode step) fill one directly. */
typedef struct {
    const float *q;          /* [Hq, L, D], C-contiguous */
    const void *k, *v;       /* row s of kv head g at k + g * k_head + s * k_row (likewise v) */
    const uint8_t *mask;     /* [L, S], nonzero: visible; or NULL: every key visible */
    float *out;              /* [Hq, L, D], C-contiguous */
    Py_ssize_t L, S, D, G;   /* query rows, keys, head dim, query heads per kv head */
    Py_ssize_t k_head, k_row, v_head, v_row;
    float scale;
    int kv_half; /* K and V are float16 (1) or float32 (0) */
    /* A sliding layer's ring (ring_rows > 0; S counts positions): key s < first_new lies
     * in slot s % ring_rows of k/v, key s >= first_new at row s - first_new of new_k/new_v
     * (kv head g at g * new_head, rows D apart). */
    const void *new_k, *new_v;
    Py_ssize_t ring_rows, first_new, new_head;
    /* The first key any row may see: blocks wholly below it are never read, their mask
     * entries included (a sliding window's keys, not the whole history). */
    Py_ssize_t key_lo;
} AttnJob;

/* out for every (head, row), split over the pool; needs no Python (call it with the GIL
 * released). Returns 0, or -1 when its scratch memory could not be allocated. */
int run_attention(const AttnJob *job, Py_ssize_t Hq, Py_ssize_t L);

/* A sliding window's attention over a ring (the job's ring fields set, S = first_new + L):
 * query row l, at position first_new + l, sees keys (pos - window, pos] that the ring
 * still holds (positions[slot] == key) or the call brought, as the Python path's mask;
 * mask [L, S] is scratch, and the job's mask and key_lo are set here. */
int run_ring_attention(AttnJob *job, const int64_t *positions, Py_ssize_t window,
                       uint8_t *mask, Py_ssize_t Hq);

/* -- pool.c ---------------------------------------------------------------------------- */

typedef void (*ChunkFn)(const void *ctx, Py_ssize_t chunk);

#if HAVE_THREADS
#define SPIN_NS 100000 /* an idle worker polls this long before it sleeps */
#else
#define SPIN_NS 0
#endif

/* Run fn(ctx, 0..total-1) across the pool; returns when every chunk is done. */
void parallel_for(ChunkFn fn, const void *ctx, Py_ssize_t total, long long spin_ns);
int pool_num_threads(void);
void pool_set_num_threads(int n);
int pool_register_fork_handlers(void); /* 0, or nonzero if pthread_atfork failed */
void pool_stats(long long *num_jobs, long long *num_stalls, long long *wait_ns);

/* -- the other files' Python entry points, added to the module by module.c ------------- */

extern PyMethodDef int8_methods[]; /* int8_module.c */
extern PyMethodDef step_methods[]; /* step_module.c */

#endif /* BRANCHCHAT_QMATMUL_H */
