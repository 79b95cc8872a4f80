/* The integer-dot-product kernels' C interface: the tiled weight layout, the quantized
 * activations, and the entry points other C files (the decode step) call.
 *
 *   int8_quant.c   activations to int8 blocks of 32, and the weight layout's accessors
 *   int8_matmul.c  out = x @ W^T on the code path the CPU has (runtime dispatch)
 *   int8_module.c  the Python entry points
 *
 * Weight layout (built once at load by kernels/int8_matmul.py from a QMatrix, W = s*q + b
 * per group, q unsigned): rows in tiles of 16 (n padded with zero rows), each tile's k
 * contiguous. For k-quad p (elements 4p..4p+3) a tile's 16 rows x 4 bytes form one 64-byte
 * vector, byte 4r + i = q[row r, 4p + i], so one vpdpbusd sums 4 products for 16 rows.
 *   bits <= 4: qs holds nibbles, two quads per vector: byte 4r+i of vector v has
 *              q[r, 8v + i] in its low and q[r, 8v + 4 + i] in its high nibble (k/2 bytes
 *              a row);
 *   bits 5, 6: the same nibbles, and hbits planes of bit 4 (and bit 5): one uint64 mask per
 *              quad per plane, bit 4r + i for q[r, 4p + i]; [tile][plane][k/4];
 *   bits 8:    qs holds the bytes, one quad per vector (k bytes a row).
 * scales/biases: [tiles, k / group_size, 16] float16 (when exact) or float32. A symmetric
 * type's biases are -zero * scales exactly (Q8_0: 128, Q4_0: 8, Q6_K: 32): then no biases
 * are stored (zero > 0) and each is that product, the same float, computed in register.
 *
 * Arithmetic, per x row (kernels/int8_ref.py is its definition): x in blocks of 32,
 * d = max|x| / 127, xq = round-half-even(x * (1 / d)) (0 when d = 0). Against 8-bit
 * weights x takes a second level, the residual fma(-d, xq, x) quantized the same way (d2,
 * xq2): one level's ~0.4% error would waste the weights' precision (SmolLM2's Q8_0 head
 * in one level lost 1% of top-1 agreement with float64). For output j and group g, over
 * the 32-blocks b the group overlaps, in order, with isum/xsum the integer sums of q*xq
 * and xq over the overlap (isum2/xsum2 those of xq2):
 *     t = fma(d_b, isum, t)  [t = fma(d2_b, isum2, t)]     (t from 0)
 *     xb = fma(d_b, xsum, xb)  [xb = fma(d2_b, xsum2, xb)]  (xb from 0)
 *     acc_s = fma(s_jg, t, acc_s),          acc_b = fma(b_jg, xb, acc_b)
 * and out_j = acc_s + acc_b. Integer sums are exact and every float step has this fixed
 * order, so a row's outputs do not depend on the rows beside it, the thread count or the
 * code path.
 */
#ifndef BRANCHCHAT_INT8_H
#define BRANCHCHAT_INT8_H

#include "qmatmul.h"

#define I8_TILE 16  /* output rows per tile */
#define I8_BLOCK 32 /* activations per quantization block */

/* The code paths, best last; i8_path is the one in use (int8_matmul.c). */
enum { I8_GENERIC, I8_AVX2, I8_AVXVNNI, I8_AVX512VNNI, I8_NUM_PATHS };
extern int i8_path; /* -1 until first use */
int i8_current_path(void); /* i8_path, the best supported one when not chosen yet */
extern const char *const I8_PATH_NAMES[I8_NUM_PATHS];
int i8_path_supported(int path); /* whether this build and this CPU can run it */

typedef struct {
    const uint8_t *qs;     /* [tiles, 16 * k * (bits <= 6 ? 1/2 : 1)] */
    const uint64_t *hbits; /* [tiles, planes, k / 4] for bits 5 and 6, else NULL */
    const void *scales;    /* [tiles, groups, 16], float16 (half) or float32 */
    const void *biases;    /* same, or NULL when zero > 0 */
    Py_ssize_t n, k;       /* n real rows; tiles = ceil(n / 16) */
    int bits, group_size, half;
    int zero;              /* > 0: biases = -zero * scales */
} I8Mat; /* borrowed pointers into a Python Int8Matrix's arrays */

/* Fills w from an Int8Matrix (attributes qs, hbits, scales, biases, n, k, bits,
 * group_size, half, zero); views must have room for 4 buffers, *nviews counts those taken (release
 * them with PyBuffer_Release after use, also on failure). 0, or -1 with a Python error. */
int i8mat_from_object(PyObject *obj, I8Mat *w, Py_buffer *views, int *nviews);

/* out[r * ld_out + j] for r < m, j < n (ld_out >= n): x [m, k] row-major float32 @ W^T.
 * Uses the pool; callable without the GIL. Allocates its scratch (the quantized x);
 * returns 0, or -1 when that allocation fails (out untouched). */
int i8_matmul(const I8Mat *w, const float *x, Py_ssize_t m, float *out, Py_ssize_t ld_out);

/* Rows rows[i] of W (dequantized, fma(s, q, b): QMatrix's numbers) into out[i * k]; all
 * rows in order when rows is NULL. Uses the pool. */
void i8_dequantize(const I8Mat *w, const int64_t *rows, Py_ssize_t count, float *out);

/* -- shared between the int8 files -------------------------------------------------------- */

/* One x row quantized: xq [k] int8, d [k / 32], xb [k / group_size] (the bias sums);
 * hsum [k / 16] is scratch (the sums of xq's 16-element halves). xq2, d2 and hsum2: the
 * second level (the residual's), or NULL for one level. */
typedef struct {
    int8_t *xq;
    float *d, *xb;
    int32_t *hsum;
    int8_t *xq2;
    float *d2;
    int32_t *hsum2;
} I8Row;

/* 8-bit weights meet x in two levels (int8.h's arithmetic, above). */
static inline int i8_levels(int bits) { return bits == 8 ? 2 : 1; }

/* Row x [k] into r (the definition above; group_size for xb). */
void i8_quantize_row(const float *x, Py_ssize_t k, int group_size, const I8Row *r);

static inline Py_ssize_t i8_tiles(const I8Mat *w) { return (w->n + I8_TILE - 1) / I8_TILE; }
static inline Py_ssize_t i8_tile_qs_bytes(const I8Mat *w) {
    return I8_TILE * w->k * (w->bits == 8 ? 2 : 1) / 2;
}
static inline int i8_planes(const I8Mat *w) { return w->bits == 5 ? 1 : w->bits == 6 ? 2 : 0; }

/* q[row j, element e] from the tiled layout */
static inline int i8_q(const I8Mat *w, Py_ssize_t j, Py_ssize_t e) {
    const Py_ssize_t t = j / I8_TILE, r = j % I8_TILE, p = e / 4, i = e % 4;
    const uint8_t *qs = w->qs + t * i8_tile_qs_bytes(w);
    if (w->bits == 8) return qs[p * 64 + 4 * r + i];
    const uint8_t byte = qs[(p / 2) * 64 + 4 * r + i];
    int q = p % 2 ? byte >> 4 : byte & 15;
    const uint64_t *hb = w->hbits + t * i8_planes(w) * (w->k / 4);
    for (int plane = 0; plane < i8_planes(w); plane++)
        q |= (int)((hb[plane * (w->k / 4) + p] >> (4 * r + i)) & 1) << (4 + plane);
    return q;
}

#endif /* BRANCHCHAT_INT8_H */
