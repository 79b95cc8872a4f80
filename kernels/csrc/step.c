/* A whole decode or verify step of a decoder in C (see step.h): per layer RMSNorm, the
 * fused q|k|v projection (+ biases), q/k RMSNorm, rope, the KV row write, attention over
 * the visible rows, the output projection and residual, and the gated MLP, with Gemma 3's
 * sandwich norms; then the final norm and the LM head. The Python path spends ~2-3 ms of
 * a 16 ms step of the default model in a few hundred NumPy calls between the kernels;
 * here the work between the kernels is a few loops over at most STEP_MAX_ROWS rows.
 *
 * The semantics are the NumPy backend's (kernels/ops_numpy.py, engine/models/base.py);
 * the matmuls are int8.h's integer kernel or matmul.c's float one (packed weights) or a
 * plain column-block loop (dense float32 weights, which the NumPy backend would send to
 * BLAS), all split over the thread pool by output columns, so a column's value never
 * depends on the thread count.
 *
 * Attention is attention.c's: a full layer's over the buffer's rows in place, a sliding
 * layer's over its window's keys by position, whichever slot of the ring or row of this
 * call holds them, in blocks of absolute positions: the same blocks in the same order
 * whether a row comes alone, inside a verify or in a prefill piece, which keeps
 * speculation and chunking exact. (The Python path walks a ring slot by slot, so its sums
 * may round differently.)
 */
#include "step.h"

#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LANES 8       /* partial sums of a dot product: one SIMD register's worth */
#define DENSE_COLS 64 /* output columns of a dense matmul per unit of work */

/* -- small row operations ------------------------------------------------------------- */

static inline float dot_lanes(const float *restrict a, const float *restrict b, Py_ssize_t n) {
    float acc[LANES] = {0.f};
    Py_ssize_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int t = 0; t < LANES; t++) acc[t] += a[i + t] * b[i + t];
    for (; i < n; i++) acc[i % LANES] += a[i] * b[i];
    float sum = 0.f;
    for (int t = 0; t < LANES; t++) sum += acc[t];
    return sum;
}

/* y = x / sqrt(mean(x^2) + eps) * w; y may be x. */
static void rms_row(const float *x, const float *w, float *y, Py_ssize_t n, float eps) {
    const float inv = 1.0f / sqrtf(dot_lanes(x, x, n) / (float)n + eps);
    for (Py_ssize_t i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
}

/* The first `dims` features of one head at `pos`, in place (ops_numpy.rope). */
static void rope_head(float *v, const StepRope *r, const RopeTable *t, Py_ssize_t pos) {
    const int half = r->dims / 2;
    const float *cs = t->cos + pos * half, *sn = t->sin + pos * half;
    for (int i = 0; i < half; i++) {
        float c = cs[i], s = sn[i];
        if (r->mscale != 1.0f) {
            c *= r->mscale;
            s *= r->mscale;
        }
        const int ia = r->traditional ? 2 * i : i, ib = r->traditional ? 2 * i + 1 : i + half;
        const float a = v[ia], b = v[ib];
        v[ia] = a * c - b * s;
        v[ib] = a * s + b * c;
    }
}

static inline float activation(int act, float x) {
    if (act == ACT_SILU) return x / (1.0f + expf(-x));
    /* GELU's tanh approximation, in ops_numpy.gelu_tanh's order of operations, with
     * tanh(u) = 1 - 2 / (e^2u + 1) (within ~1e-7 of tanhf; glibc's tanhf goes through
     * expm1f at ~3x expf's cost: 15% of Gemma's prefill); e^2u = inf gives 1 */
    const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + (1.0f - 2.0f / (expf(2.0f * inner) + 1.0f)));
}

#if ATTN_AVX512
/* activation(ACT_GELU_TANH, x) * up in 16 lanes, in the same order of operations, e^2u by
 * attention.h's exp512 (within 2 ulp of expf; the scalar loop was ~10% of Gemma's prefill) */
static inline __m512 gelu_tanh_times16(__m512 x, __m512 up) {
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    const __m512 ax = _mm512_mul_ps(_mm512_set1_ps(0.044715f), x);
    const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(ax, x), x);
    const __m512 inner =
        _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f), _mm512_add_ps(x, cube));
    const __m512 e = exp512(_mm512_mul_ps(two, inner));
    const __m512 t = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(e, one)));
    const __m512 half_x = _mm512_mul_ps(_mm512_set1_ps(0.5f), x);
    return _mm512_mul_ps(_mm512_mul_ps(half_x, _mm512_add_ps(one, t)), up);
}

/* activation(ACT_SILU, x) * up in 16 lanes: x / (1 + e^-x), e^-x by exp512 (the scalar
 * expf was 9% of an 8-row verify of the default model) */
static inline __m512 silu_times16(__m512 x, __m512 up) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), up);
}
#endif

/* out[j] = activation(gate[j]) * up[j] for j < n: a lane's value never depends on where
 * it falls in a register (the tail goes through the same operations, masked). */
static void activate_row(int act, const float *gate, const float *up, float *out, Py_ssize_t n) {
#if ATTN_AVX512
    if (isa == ISA_AVX512) {
        for (Py_ssize_t j = 0; j < n; j += 16) {
            const __mmask16 live = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
            const __m512 x = _mm512_maskz_loadu_ps(live, gate + j);
            const __m512 u = _mm512_maskz_loadu_ps(live, up + j);
            _mm512_mask_storeu_ps(out + j, live,
                                  act == ACT_SILU ? silu_times16(x, u) : gelu_tanh_times16(x, u));
        }
        return;
    }
#endif
    for (Py_ssize_t j = 0; j < n; j++) out[j] = activation(act, gate[j]) * up[j];
}

/* float32 -> float16, rounded to nearest even (numpy's astype, F16C's conversion). */
static inline uint16_t float_to_half(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t mag = x & 0x7fffffffu;
    if (mag >= 0x7f800000u) return sign | 0x7c00 | (mag > 0x7f800000u ? 0x200 : 0);
    if (mag >= 0x477ff000u) return sign | 0x7c00; /* rounds past 65504: infinity */
    if (mag < 0x38800000u) {                       /* below 2^-14: a subnormal half */
        float a;
        memcpy(&a, &mag, sizeof a);
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    }
    uint32_t h = (mag - 0x38000000u) >> 13, rest = mag & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
    return sign | (uint16_t)h;
#endif
}

/* A row of n floats stored at `at` (element offset) in a KV buffer of either dtype. */
static void store_row(void *base, int half, Py_ssize_t at, const float *src, Py_ssize_t n) {
    if (!half) {
        memcpy((float *)base + at, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *dst = (uint16_t *)base + at;
    Py_ssize_t i = 0;
#if ATTN_AVX512
    /* 16 at a time, the same rounding (to nearest even) as float_to_half's */
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) dst[i] = float_to_half(src[i]);
}

/* -- projections ---------------------------------------------------------------------- */

typedef struct {
    const float *w, *x; /* w [k, n], x [m, k] */
    float *out;         /* [m, n] */
    Py_ssize_t m, k, n;
} DenseJob;

static void dense_chunk(const void *ctx, Py_ssize_t chunk) {
    const DenseJob *job = ctx;
    const Py_ssize_t j0 = chunk * DENSE_COLS;
    const Py_ssize_t cols = job->n - j0 < DENSE_COLS ? job->n - j0 : DENSE_COLS;
    for (Py_ssize_t r = 0; r < job->m; r++) {
        float acc[DENSE_COLS] = {0.f};
        const float *xr = job->x + r * job->k;
        for (Py_ssize_t i = 0; i < job->k; i++) {
            const float xv = xr[i], *wr = job->w + i * job->n + j0;
            for (Py_ssize_t c = 0; c < cols; c++) acc[c] += xv * wr[c];
        }
        memcpy(job->out + r * job->n + j0, acc, (size_t)cols * sizeof(float));
    }
}

/* out [m, cols] (rows ld apart) = x [m, k] @ W^T for one part; -1 when the int8
 * kernel's scratch could not be allocated. */
static int part_run(const LinearPart *p, Py_ssize_t k, const float *x, Py_ssize_t m, float *out,
                    Py_ssize_t ld, float *pack) {
    if (p->kind == PART_INT8) return i8_matmul(&p->i8, x, m, out, ld);
    if (p->kind == PART_QMAT) {
        run_matmul(&p->q, x, out, m, pack);
    } else {
        const DenseJob job = {p->dense, x, out, m, k, p->cols};
        parallel_for(dense_chunk, &job, (p->cols + DENSE_COLS - 1) / DENSE_COLS, SPIN_NS);
    }
    return 0;
}

/* out [m, n] = x [m, k] @ W^T; a part of several writes its columns in place (int8) or
 * through tmp (the kernels that write whole rows). */
static int linear_run(const Linear *lin, const float *x, Py_ssize_t m, float *out, float *pack,
                      float *tmp) {
    for (int i = 0; i < lin->num_parts; i++) {
        const LinearPart *p = &lin->parts[i];
        if (lin->num_parts == 1 || p->kind == PART_INT8) {
            if (part_run(p, lin->k, x, m, out + p->col0, lin->n, pack) < 0) return -1;
            continue;
        }
        part_run(p, lin->k, x, m, tmp, p->cols, pack);
        for (Py_ssize_t r = 0; r < m; r++)
            memcpy(out + r * lin->n + p->col0, tmp + r * p->cols, (size_t)p->cols * sizeof(float));
    }
    return 0;
}

/* -- the step ------------------------------------------------------------------------- */

/* Scratch of one call, floats; `pack` is matmul.c's repacked x (cache-line aligned). */
typedef struct {
    float *xn, *qkv, *q, *o, *ao, *proj, *gu, *act, *tmp, *pack;
    uint8_t *mask; /* [L, smax]: the layer's mask for attention.c */
} Scratch;

static Py_ssize_t max_part_cols(const Linear *lin) {
    Py_ssize_t most = 0;
    for (int i = 0; lin->num_parts > 1 && i < lin->num_parts; i++)
        if (lin->parts[i].cols > most) most = lin->parts[i].cols;
    return most;
}

static int scratch_alloc(const StepPlan *p, Py_ssize_t L, Py_ssize_t smax, Scratch *s) {
    const Py_ssize_t nqkv = (p->H + 2 * p->Hkv) * p->Dh, hd = p->H * p->Dh;
    Py_ssize_t kmax = p->D > hd ? p->D : hd, tmp = max_part_cols(&p->head);
    if (p->F > kmax) kmax = p->F;
    for (int i = 0; i < p->num_layers; i++) {
        const StepLayer *ly = &p->layers[i];
        const Py_ssize_t most[4] = {max_part_cols(&ly->qkv), max_part_cols(&ly->o),
                                    max_part_cols(&ly->gate_up), max_part_cols(&ly->down)};
        for (int j = 0; j < 4; j++)
            if (most[j] > tmp) tmp = most[j];
    }
    const Py_ssize_t mask_floats = (smax + 3) / 4;
    const Py_ssize_t sizes[10] = {p->D, nqkv, hd, hd, hd, p->D, 2 * p->F, p->F, tmp, mask_floats};
    Py_ssize_t total = 0;
    for (int i = 0; i < 10; i++) total += L * sizes[i];
    float *base = malloc((size_t)(total > 0 ? total : 1) * sizeof(float));
    s->pack = alloc_aligned((size_t)(L * kmax) * sizeof(float));
    if (!base || !s->pack) {
        free(base);
        free_aligned(s->pack);
        return -1;
    }
    float *mask = NULL;
    float **slots[10] = {&s->xn, &s->qkv, &s->q,   &s->o,   &s->ao,
                         &s->proj, &s->gu, &s->act, &s->tmp, &mask};
    for (int i = 0; i < 10; i++) {
        *slots[i] = base;
        base += L * sizes[i];
    }
    s->mask = (uint8_t *)mask;
    return 0;
}

/* Normalise, rotate and store the call's q, k and v rows of one layer. */
static void project_heads(const StepPlan *p, const StepLayer *ly, const StepKV *kv,
                          const RopeTable *table, const Scratch *s, Py_ssize_t L,
                          Py_ssize_t offset) {
    const Py_ssize_t Dh = p->Dh, nqkv = (p->H + 2 * p->Hkv) * Dh;
    const StepRope *rope = &p->ropes[ly->rope];
    for (Py_ssize_t l = 0; l < L; l++) {
        float *row = s->qkv + l * nqkv;
        if (ly->qkv_bias)
            for (Py_ssize_t c = 0; c < nqkv; c++) row[c] += ly->qkv_bias[c];
        for (Py_ssize_t h = 0; h < p->H; h++) {
            float *q = s->q + (h * L + l) * Dh;
            memcpy(q, row + h * Dh, (size_t)Dh * sizeof(float));
            if (ly->q_norm) rms_row(q, ly->q_norm, q, Dh, p->eps);
            rope_head(q, rope, table, offset + l);
        }
        for (Py_ssize_t g = 0; g < p->Hkv; g++) {
            const Py_ssize_t at = (kv->positions ? g * L + l : g * kv->rows + offset + l) * Dh;
            float k[ATTN_MAX_DIM];
            memcpy(k, row + (p->H + g) * Dh, (size_t)Dh * sizeof(float));
            if (ly->k_norm) rms_row(k, ly->k_norm, k, Dh, p->eps);
            rope_head(k, rope, table, offset + l);
            store_row(kv->positions ? kv->new_k : kv->keys, kv->half, at, k, Dh);
            store_row(kv->positions ? kv->new_v : kv->values, kv->half, at,
                      row + (p->H + p->Hkv + g) * Dh, Dh);
        }
    }
}

/* attention.c's out [H, L, Dh] in ao as the o projection's rows [L, H * Dh] in o. */
static void heads_to_rows(const StepPlan *p, const Scratch *s, Py_ssize_t L) {
    const Py_ssize_t Dh = p->Dh;
    for (Py_ssize_t h = 0; h < p->H; h++)
        for (Py_ssize_t l = 0; l < L; l++)
            memcpy(s->o + (l * p->H + h) * Dh, s->ao + (h * L + l) * Dh, (size_t)Dh * sizeof(float));
}

/* A full layer's attention, as the Python path calls it: keys [0, offset + L) in place, a
 * causal mask for a verify's rows. */
static int full_attention(const StepPlan *p, const StepLayer *ly, const StepKV *kv,
                          const Scratch *s, Py_ssize_t L, Py_ssize_t offset) {
    const Py_ssize_t S = offset + L, Dh = p->Dh;
    for (Py_ssize_t l = 0; l < L && L > 1; l++) {
        memset(s->mask + l * S, 1, (size_t)(offset + l + 1));
        memset(s->mask + l * S + offset + l + 1, 0, (size_t)(L - l - 1));
    }
    const AttnJob job = {.q = s->q, .k = kv->keys, .v = kv->values,
                         .mask = L > 1 ? s->mask : NULL, .out = s->ao, .L = L, .S = S, .D = Dh,
                         .G = p->H / p->Hkv, .k_head = kv->rows * Dh, .k_row = Dh,
                         .v_head = kv->rows * Dh, .v_row = Dh, .scale = ly->scale,
                         .kv_half = kv->half};
    if (run_attention(&job, p->H, L) < 0) return -1;
    heads_to_rows(p, s, L);
    return 0;
}

/* A sliding layer's attention, its keys by position: below offset from the ring's slots,
 * from offset on the call's rows. */
static int sliding_attention(const StepPlan *p, const StepLayer *ly, const StepKV *kv,
                             const Scratch *s, Py_ssize_t L, Py_ssize_t offset) {
    const Py_ssize_t Dh = p->Dh;
    AttnJob job = {.q = s->q, .k = kv->keys, .v = kv->values, .out = s->ao, .L = L,
                   .S = offset + L, .D = Dh, .G = p->H / p->Hkv, .k_head = kv->rows * Dh,
                   .k_row = Dh, .v_head = kv->rows * Dh, .v_row = Dh, .scale = ly->scale,
                   .kv_half = kv->half, .new_k = kv->new_k, .new_v = kv->new_v,
                   .ring_rows = kv->rows, .first_new = offset, .new_head = L * Dh};
    if (run_ring_attention(&job, kv->positions, ly->window, s->mask, p->H) < 0) return -1;
    heads_to_rows(p, s, L);
    return 0;
}

static int run_layer(const StepPlan *p, const StepLayer *ly, const StepKV *kv,
                      const RopeTable *tables, float *x, Py_ssize_t L, Py_ssize_t offset,
                      const Scratch *s) {
    const Py_ssize_t D = p->D, F = p->F;
    const int sandwich = ly->pre_ffw_norm != NULL;
    for (Py_ssize_t l = 0; l < L; l++) rms_row(x + l * D, ly->input_norm, s->xn + l * D, D, p->eps);
    if (linear_run(&ly->qkv, s->xn, L, s->qkv, s->pack, s->tmp) < 0) return -1;
    project_heads(p, ly, kv, &tables[ly->rope], s, L, offset);

    if ((ly->window ? sliding_attention : full_attention)(p, ly, kv, s, L, offset) < 0) return -1;

    if (linear_run(&ly->o, s->o, L, s->proj, s->pack, s->tmp) < 0) return -1;
    for (Py_ssize_t l = 0; l < L; l++) {
        float *proj = s->proj + l * D, *xr = x + l * D;
        if (sandwich) rms_row(proj, ly->post_norm, proj, D, p->eps);
        for (Py_ssize_t i = 0; i < D; i++) xr[i] += proj[i];
        rms_row(xr, sandwich ? ly->pre_ffw_norm : ly->post_norm, s->xn + l * D, D, p->eps);
    }
    if (linear_run(&ly->gate_up, s->xn, L, s->gu, s->pack, s->tmp) < 0) return -1;
    for (Py_ssize_t l = 0; l < L; l++)
        activate_row(p->act, s->gu + l * 2 * F, s->gu + l * 2 * F + F, s->act + l * F, F);
    if (linear_run(&ly->down, s->act, L, s->proj, s->pack, s->tmp) < 0) return -1;
    for (Py_ssize_t l = 0; l < L; l++) {
        float *proj = s->proj + l * D, *xr = x + l * D;
        if (sandwich) rms_row(proj, ly->post_ffw_norm, proj, D, p->eps);
        for (Py_ssize_t i = 0; i < D; i++) xr[i] += proj[i];
    }
    return 0;
}

int step_run(const StepPlan *plan, float *x, Py_ssize_t L, Py_ssize_t offset, const StepKV *kv,
             const RopeTable *tables, float *logits, Py_ssize_t logit_rows, const StepTaps *taps) {
    Scratch s;
    const Py_ssize_t smax = offset + L, D = plan->D; /* keys a query may see */
    if (scratch_alloc(plan, L, smax, &s) < 0) return -1;
    int rc = 0, slot = 0;
    for (int i = 0; i < plan->num_layers && rc == 0; i++) {
        rc = run_layer(plan, &plan->layers[i], &kv[i], tables, x, L, offset, &s);
        if (taps && slot < taps->count && taps->layers[slot] == i) { /* row r's slot-th D */
            const Py_ssize_t width = (Py_ssize_t)taps->count * D;
            for (Py_ssize_t r = 0; r < L; r++)
                memcpy(taps->out + r * width + slot * D, x + r * D, (size_t)D * sizeof(float));
            slot++;
        }
    }
    if (rc == 0 && logit_rows > 0) {
        const Py_ssize_t first = L - logit_rows;
        for (Py_ssize_t r = 0; r < logit_rows; r++)
            rms_row(x + (first + r) * D, plan->final_norm, s.xn + r * D, D, plan->eps);
        /* the head's parts write through tmp, sized for L rows of its widest part */
        rc = linear_run(&plan->head, s.xn, logit_rows, logits, s.pack, s.tmp);
    }
    free(s.xn);
    free_aligned(s.pack);
    return rc;
}
