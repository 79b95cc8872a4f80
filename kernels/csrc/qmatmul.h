/* What the files of the C kernel kernels._qmatmul share (setup.py builds them into one
 * extension): the code paths this build has, the quantized matrix, and each file's entry
 * points for the others.
 *
 *   matmul.c     products against packed quantized weights, and their dequantization
 *   attention.c  softmax attention for the few query rows of a decode or verify step
 *   pool.c       the thread pool both split their work over
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

typedef struct {
    const uint8_t *packed; /* [n, k * bits / 8] */
    const void *scales;    /* [n, k / group_size], float32 or float16 (half) */
    const void *biases;    /* [n, k / group_size], same type */
    Py_ssize_t n, k;
    int group_size, bits, half;
} QMat;

/* -- matmul.c -------------------------------------------------------------------------- */

/* out[m, n] = x[m, k] @ W^T; scratch: m * k floats from alloc_aligned */
void run_matmul(const QMat *w, const float *x, float *out, Py_ssize_t m, float *scratch);
/* rows[i] of W (all of W when rows is NULL) into out[i, :] */
void run_dequantize(const QMat *w, const int64_t *rows, Py_ssize_t count, float *out);
void *alloc_aligned(size_t size);
void free_aligned(void *p);

/* -- attention.c ----------------------------------------------------------------------- */

#define ATTN_MAX_DIM 512 /* head dims the C attention takes */

typedef struct {
    const float *q, *k, *v;
    const uint8_t *mask; /* [L, S] or NULL: every key visible */
    float *out, *scores; /* scores: [Hq * L, S] scratch */
    Py_ssize_t L, S, D, G, k_head, k_row, v_head, v_row;
    float scale;
} AttnJob;

/* out for every (head, row): job->scores holds Hq * L rows of S floats */
void run_attention(const AttnJob *job, Py_ssize_t Hq, Py_ssize_t L);

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

#endif /* BRANCHCHAT_QMATMUL_H */
