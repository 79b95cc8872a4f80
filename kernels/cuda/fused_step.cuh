// Device code of the one-launch step (after fused_decode.cuh): register-held loads, the
// weight table and its warp-wide dot products, the residual phase, L2 prefetch, grid barrier.

// BYTES raw bytes in registers: loaded past L1 (data other blocks wrote in this launch)
// or through the read-only path (weights).
template <int BYTES> struct FsRaw {
  uint4 v[BYTES / 16];
  __device__ __forceinline__ void load_cg(const void* p) {
#pragma unroll
    for (int i = 0; i < BYTES / 16; ++i) v[i] = __ldcg(reinterpret_cast<const uint4*>(p) + i);
  }
  __device__ __forceinline__ void load_ro(const void* p) {
#pragma unroll
    for (int i = 0; i < BYTES / 16; ++i) v[i] = __ldg(reinterpret_cast<const uint4*>(p) + i);
  }
};
template <> struct FsRaw<8> {
  uint2 v;
  __device__ __forceinline__ void load_cg(const void* p) {
    v = __ldcg(reinterpret_cast<const uint2*>(p));
  }
};
template <> struct FsRaw<4> {
  unsigned int v;
  __device__ __forceinline__ void load_cg(const void* p) {
    v = __ldcg(reinterpret_cast<const unsigned int*>(p));
  }
};
template <> struct FsRaw<2> {
  unsigned short v;
  __device__ __forceinline__ void load_cg(const void* p) {
    v = __ldcg(reinterpret_cast<const unsigned short*>(p));
  }
};

template <typename W, int N, int BYTES>
__device__ __forceinline__ void fs_unpack(const FsRaw<BYTES>& raw, float* out) {
  const W* v = reinterpret_cast<const W*>(&raw.v);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = static_cast<float>(v[i]);
}

__device__ __forceinline__ void fs_load8_ro(const float* p, float* out) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p + 4));
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

__device__ __forceinline__ void fs_load8_cg(const float* p, float* out) {
  const float4 a = __ldcg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldcg(reinterpret_cast<const float4*>(p + 4));
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

// -- Weights as stored. Every matrix of the step (layer l's qkv, o, gate_up and down are
// matrices 4l .. 4l + 3, then the LM head, then the embedding table) is up to FQ_PARTS row
// parts of one table (kernels/fused_step_cuda.py's WeightTable): an affine-quantized part,
// w = s * q + b per group of 16..128 elements with q of 2..8 bits packed as MLX packs them
// (s and b float32), or a dense float16 / bfloat16 / float32 one. A part's words start on a
// 16-byte boundary and the table's words end in padding, so a slice's loads stay inside.
//
// The dot products below pin their rounding with intrinsics (no contraction left to the
// compiler): a row's result is the same whatever the row count, chunking or unrolling of the
// build that computes it, which keeps the decode and verify builds bit-identical per row.

#define FQ_PARTS 4
#define FQ_FIELDS 8
#define FQ_ROW0 0      // the part's first row in the matrix
#define FQ_WORDS 1     // its first word in `words`
#define FQ_GROUPS 2    // its first slot of `scales`
#define FQ_ROW_WORDS 3 // words a row
#define FQ_FMT 4       // 2..8: affine bits; FQ_F16, FQ_BF16, FQ_F32: dense; FQ_K*: factors
#define FQ_SHIFT 5     // log2 of the group size
#define FQ_GPR 6       // groups a row
#define FQ_BIAS 7      // its first slot of `biases`
// K-quant factors (kernels/step_factors.py), 64 or 128 + bits: a uint16 code a group in
// `scales` and a float16 pair a super-block of 256 in `biases`. FQ_KMIN: code sc | m << 8,
// s = d sc, b = -(dmin m); FQ_KSIGNED: code sc + 128, s = d sc, b = -2^(bits-1) s. Each
// product of a float16 and an integer of 8 bits is exact in float32: the same s and b.
#define FQ_KMIN 64
#define FQ_KSIGNED 128
#define FQ_F16 16
#define FQ_BF16 17
#define FQ_F32 32

struct FqPart {
  const uint32_t* w;  // the part's row 0
  const uint32_t* s;  // its group scales [rows, gpr] (affine parts), float32 bits
  const uint32_t* b;  // and biases (a K-quant's factors: codes and float16 pairs)
  int row_words, shift, gpr;
};

struct FqTable {
  const int64_t* meta;  // [matrices, FQ_PARTS, FQ_FIELDS]
  const uint32_t* words;
  const uint32_t* scales;  // float32 bits, or codes and pairs: moved as integers only
  const uint32_t* biases;

  __device__ __forceinline__ int64_t field(int mat, int part, int f) const {
    return meta[((size_t)mat * FQ_PARTS + part) * FQ_FIELDS + f];
  }
  // The part of matrix `mat` that holds `row` (into p), the row's index in it, its format.
  __device__ __forceinline__ int part(int mat, int row, FqPart& p, int& local) const {
    int k = 0;
    if (row >= field(mat, 1, FQ_ROW0)) k = 1;
    if (row >= field(mat, 2, FQ_ROW0)) k = 2;
    if (row >= field(mat, 3, FQ_ROW0)) k = 3;
    local = row - static_cast<int>(field(mat, k, FQ_ROW0));
    p.w = words + field(mat, k, FQ_WORDS);
    p.s = scales + field(mat, k, FQ_GROUPS);
    p.b = biases + field(mat, k, FQ_BIAS);
    p.row_words = static_cast<int>(field(mat, k, FQ_ROW_WORDS));
    p.shift = static_cast<int>(field(mat, k, FQ_SHIFT));
    p.gpr = static_cast<int>(field(mat, k, FQ_GPR));
    return static_cast<int>(field(mat, k, FQ_FMT));
  }
};

// an integer below 2^23 as a float by its exponent bits (no I2F: see decode)
__device__ __forceinline__ float fq_small_float(unsigned int q) {
  return __fsub_rn(__uint_as_float(0x4B000000u | q), 8388608.0f);
}

// Eight consecutive weights k .. k + 7 (k a multiple of 8) of one row, as loaded (`load`:
// the words and the group's s, b) and as float32 (`decode`).
template <int FMT>
struct FqSlice {
  static constexpr bool KMIN = FMT >= FQ_KMIN && FMT < FQ_KSIGNED, KSIGNED = FMT >= FQ_KSIGNED;
  static constexpr bool AFFINE = FMT <= 8 || KMIN || KSIGNED;
  static constexpr int BITS = AFFINE ? (FMT & 15) : FMT;  // of q (affine), else the format
  static constexpr int NW = BITS == FQ_F32 ? 8
                            : BITS >= FQ_F16 ? 4
                            : BITS == 8 ? 2
                            : (BITS == 4 || BITS == 2) ? 1
                            : (8 * BITS + 24 + 31) / 32;  // 3, 5, 6 bits: any byte offset
  uint32_t v[NW];
  float s, b;

  __device__ __forceinline__ void load(const FqPart& p, int r, int k) {
    const uint32_t* row = p.w + (size_t)r * p.row_words;
    if constexpr (FMT == FQ_F32) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(row + k));
      const uint4 c = __ldg(reinterpret_cast<const uint4*>(row + k) + 1);
      v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
      v[4] = c.x; v[5] = c.y; v[6] = c.z; v[7] = c.w;
    } else if constexpr (FMT == FQ_F16 || FMT == FQ_BF16) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(row + k / 2));
      v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    } else if constexpr (BITS == 8) {
      const uint2 a = __ldg(reinterpret_cast<const uint2*>(row + k / 4));
      v[0] = a.x; v[1] = a.y;
    } else if constexpr (BITS == 4) {
      v[0] = __ldg(row + k / 8);
    } else if constexpr (BITS == 2) {
      v[0] = __ldg(row + k / 16);
    } else {
      const int w0 = k * BITS / 32;
#pragma unroll
      for (int i = 0; i < NW; ++i) v[i] = __ldg(row + w0 + i);
    }
    if constexpr (KMIN || KSIGNED) {
      const size_t g = (size_t)r * p.gpr + (k >> p.shift);  // super-block: g / (256 >> shift)
      const unsigned int code = __ldg(reinterpret_cast<const unsigned short*>(p.s) + g);
      const float2 d = __half22float2(__ldg(reinterpret_cast<const __half2*>(p.b) + (g >> (8 - p.shift))));
      if constexpr (KMIN) {
        s = __fmul_rn(d.x, fq_small_float(code & 0xFFu));
        b = -__fmul_rn(d.y, fq_small_float(code >> 8));
      } else {
        s = __fmul_rn(d.x, __fsub_rn(fq_small_float(code), 128.0f));
        b = __fmul_rn(-static_cast<float>(1 << (BITS - 1)), s);
      }
    } else if constexpr (AFFINE) {
      const size_t g = (size_t)r * p.gpr + (k >> p.shift);
      s = __uint_as_float(__ldg(p.s + g));
      b = __uint_as_float(__ldg(p.b + g));
    }
  }

  __device__ __forceinline__ void decode(int k, float* out) const {
    if constexpr (FMT == FQ_F32) {
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = __uint_as_float(v[i]);
    } else if constexpr (FMT == FQ_F16) {
      const __half* h = reinterpret_cast<const __half*>(v);
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = __half2float(h[i]);
    } else if constexpr (FMT == FQ_BF16) {
      const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(v);
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = __bfloat162float(h[i]);
    } else {
      unsigned long long bits;
      if constexpr (BITS == 4) {
        bits = v[0];
      } else if constexpr (BITS == 2) {
        bits = v[0] >> ((k % 16) * 2);
      } else if constexpr (BITS == 8) {
        bits = v[0] | (static_cast<unsigned long long>(v[1]) << 32);
      } else {
        const int sh = (k * BITS) % 32;
        bits = (v[0] | (static_cast<unsigned long long>(v[1]) << 32)) >> sh;
        if constexpr (NW == 3) {
          if (sh) bits |= static_cast<unsigned long long>(v[2]) << (64 - sh);
        }
      }
      // q as a float without an integer conversion (I2F issues at an eighth of FFMA's rate
      // on sm_90, and a dot product is one a weight): 0x4B000000 | q is the float 2^23 + q,
      // so subtracting 2^23 gives q exactly (q < 2^23), and then the same fma as before.
      constexpr unsigned int MASK = (1u << BITS) - 1u;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const unsigned int q = static_cast<unsigned int>(bits >> (BITS * i)) & MASK;
        out[i] = __fmaf_rn(s, fq_small_float(q), b);
      }
    }
  }
};

// x [M, K] of a dot product: its first `staged` floats copied into the block's shared
// memory (fq_stage), the rest read from L2. Every warp of a block reads the same x for each
// of its rows, so from L2 a phase's x traffic is rows x K floats (several times its weight
// bytes) at L2 latency; staged, it is read once a block. The values are the same either way.
// FQ_SWIZZLE 1 stores 16-byte piece q of x at q ^ ((q >> 3) & 7) (a 128-byte row's eight
// pieces permuted by the row's index): the eight lanes of a quarter warp then read eight
// banks' groups where they read two (a lane's 8 floats a slice) or one (FQ_WIDE's 32).
#ifndef FQ_SMEM_X
#define FQ_SMEM_X 0
#endif
#ifndef FQ_SWIZZLE
#define FQ_SWIZZLE 0
#endif
// where float i of x (i a multiple of 4) lies in the staged copy
__device__ __forceinline__ int fq_staged_at(int i) {
  if (!FQ_SWIZZLE) return i;
  const int q = i >> 2;
  return (q ^ ((q >> 3) & 7)) << 2;
}
struct FqX {
  const float* g;  // x in global memory (written by other blocks: read past L1)
  const float* s;  // its first `staged` floats, in shared memory (fq_staged_at's order)
  int staged, base;  // base: float 0's index in the staged copy's x
  // x in int8 (fq_stage_i8; q8 null: float x only): rows of k8 int8s, each 8 as x0 x2 x4 x6
  // x1 x3 x5 x7, a scale a 32 (d8) and each row's sum of squares in FD_WARPS parts (ss8,
  // staged with a norm only), in shared memory
  const uint32_t* q8 = nullptr;
  const float* d8 = nullptr;
  const float* ss8 = nullptr;
  int k8 = 0;

  __device__ __forceinline__ void load8(int i, float* out) const {
    if (i < staged) {
      const float4 a = *reinterpret_cast<const float4*>(s + fq_staged_at(base + i));
      const float4 b = *reinterpret_cast<const float4*>(s + fq_staged_at(base + i + 4));
      out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
      out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
    } else {
      fs_load8_cg(g + i, out);
    }
  }
  // x from float n on (n: a row's start, in int8 a multiple of the row)
  __device__ __forceinline__ FqX at(int n) const {
    if (!q8) return {g + n, s, staged - n, base + n};
    return {g + n, s, staged - n, base + n, q8 + n / 4, d8 + n / 32, ss8 + n / k8 * FD_WARPS, k8};
  }
};

// The first min(n, FQ_SMEM_X) floats of x into `sm` (every thread of the block calls it,
// past the grid barrier that published x; the next barrier frees `sm` again). `sm` is the
// launch's dynamic shared memory (StepKernel asks for FQ_SMEM_X floats); if the launch has
// less, only what fits is staged and the rest is read from L2, so x is never read past it.
// (Swizzled, room is whole 128-byte rows: a staged float's place stays below it.)
__device__ __forceinline__ FqX fq_stage(const float* x, int n, float* sm) {
  unsigned int bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  const int room = FQ_SWIZZLE ? min(FQ_SMEM_X & ~31, static_cast<int>(bytes / 128) * 32)
                              : min(FQ_SMEM_X, static_cast<int>(bytes / 32) * 8);  // whole slices
  const int staged = n < room ? n : room;
  if (FQ_SMEM_X > 0) {
    for (int i = threadIdx.x * 4; i < staged; i += blockDim.x * 4)
      *reinterpret_cast<float4*>(sm + fq_staged_at(i)) = __ldcg(reinterpret_cast<const float4*>(x + i));
    __syncthreads();
  }
  return {x, sm, staged, 0};
}

// Slices a dot product loads at once: FQ_SLICES of the R rows in all, at most the row's IT.
// FQ_STREAM 0 decodes a chunk's slices into registers before any row of x meets them (R *
// CH * 8 floats); 1 keeps only the loaded words of the chunk and decodes each slice as it
// is used, so a chunk can be deeper (more bytes in flight) in the same registers. Both give
// a row the same operations in the same order; bench/gpu/step_tuning.py times them.
#ifndef FQ_SLICES
#define FQ_SLICES 8
#endif
#ifndef FQ_STREAM
#define FQ_STREAM 0
#endif
__host__ __device__ constexpr int fq_chunk(int R, int IT) {
  return (R >= FQ_SLICES ? 1 : FQ_SLICES / R) < IT ? (R >= FQ_SLICES ? 1 : FQ_SLICES / R) : IT;
}

template <int FMT, int K, int R, int CH>
__device__ __forceinline__ void fq_load_chunk(
    const FqPart& p, const int (&rows)[R], int c0, FqSlice<FMT> (&q)[R][CH]) {
  constexpr int IT = (K + 255) / 256;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int k = (c0 + j) * 256 + lane * 8;
    if (c0 + j < IT && k < K) {
#pragma unroll
      for (int r = 0; r < R; ++r) q[r][j].load(p, rows[r], k);
    }
  }
}

// A dot product's sums: zeroed before, then each row's lanes' partial sums added up
template <int G, int R>
__device__ __forceinline__ void fq_dot_zero(float (&acc)[G][R], float (&ss)[G]) {
#pragma unroll
  for (int m = 0; m < G; ++m) {
    ss[m] = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
  }
}

template <bool SS, int G, int R>
__device__ __forceinline__ void fq_dot_total(int M, float (&acc)[G][R], float (&ss)[G]) {
#pragma unroll
  for (int m = 0; m < G; ++m) {
    if (m < M) {
      if (SS) ss[m] = fd_warp_sum(ss[m]);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[m][r] = fd_warp_sum(acc[m][r]);
    }
  }
}

// Rows m < M <= G of x [M, K] against R weight rows of one part: acc[m][r] and, with SS,
// ss[m] = the row's sum of squares, warp-wide totals; with SCALED each weight is first
// multiplied by norm[k] (an RMS norm's weight). Per lane and slice, s = fma(x_i, w_i, s) in
// order, acc += s; then a butterfly sum. More rows take more passes (the words then come from L1).
template <int FMT, int K, int R, int G, bool SCALED, bool SS>
__device__ __forceinline__ void fq_dot_fmt(
    const FqPart& p, const int (&rows)[R], const float* norm, const FqX& x, int M,
    float (&acc)[G][R], float (&ss)[G]) {
  constexpr int IT = (K + 255) / 256;
  constexpr int CH = fq_chunk(R, IT);
  const int lane = threadIdx.x % 32;
  fq_dot_zero(acc, ss);
#pragma unroll 1
  for (int c0 = 0; c0 < IT; c0 += CH) {
    FqSlice<FMT> cur[R][CH];
    fq_load_chunk<FMT, K, R, CH>(p, rows, c0, cur);
#if FQ_STREAM
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int k = (c0 + j) * 256 + lane * 8;
      if (c0 + j < IT && k < K) {
        float nv[8], xv[G][8];
        if (SCALED) fs_load8_ro(norm + k, nv);
#pragma unroll
        for (int m = 0; m < G; ++m) {
          if (m < M) {
            x.load8(m * K + k, xv[m]);
            if (SS) {
#pragma unroll
              for (int i = 0; i < 8; ++i) ss[m] = __fmaf_rn(xv[m][i], xv[m][i], ss[m]);
            }
          }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float w[8];
          cur[r][j].decode(k, w);
          if (SCALED) {
#pragma unroll
            for (int i = 0; i < 8; ++i) w[i] = __fmul_rn(w[i], nv[i]);
          }
#pragma unroll
          for (int m = 0; m < G; ++m) {
            if (m < M) {
              float sum = 0.f;
#pragma unroll
              for (int i = 0; i < 8; ++i) sum = __fmaf_rn(xv[m][i], w[i], sum);
              acc[m][r] = __fadd_rn(acc[m][r], sum);
            }
          }
        }
      }
    }
#else
    float w[R][CH][8];
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int k = (c0 + j) * 256 + lane * 8;
      if (c0 + j < IT && k < K) {
        float nv[8];
        if (SCALED) fs_load8_ro(norm + k, nv);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          cur[r][j].decode(k, w[r][j]);
          if (SCALED) {
#pragma unroll
            for (int i = 0; i < 8; ++i) w[r][j][i] = __fmul_rn(w[r][j][i], nv[i]);
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < G; ++m) {
      if (m < M) {
#pragma unroll
        for (int j = 0; j < CH; ++j) {
          const int k = (c0 + j) * 256 + lane * 8;
          if (c0 + j < IT && k < K) {
            float xv[8];
            x.load8(m * K + k, xv);
            if (SS) {
#pragma unroll
              for (int i = 0; i < 8; ++i) ss[m] = __fmaf_rn(xv[i], xv[i], ss[m]);
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
              float s = 0.f;
#pragma unroll
              for (int i = 0; i < 8; ++i) s = __fmaf_rn(xv[i], w[r][j][i], s);
              acc[m][r] = __fadd_rn(acc[m][r], s);
            }
          }
        }
      }
    }
#endif
  }
  fq_dot_total<SS>(M, acc, ss);
}

// FQ_WIDE (a row length, 0: off): a 4-, 6- or 8-bit affine part's rows of K >= FQ_WIDE
// weights (K a multiple of 32) load 32 weights a lane: BITS words (16-byte loads where BITS
// is a multiple of 4, 8-byte ones for 6) with their group's scale and bias (two groups
// for 6 bits, Q6_K's groups of 16; one of 32 or more for 4 and 8: kernels/step_weights.py's
// check_wide), 1,024 weights a warp. fq_dot_fmt loads 8 weights a lane with a scale and a
// bias each: the wide slice holds twice the weight bytes in the same registers, in a
// quarter of the load instructions. A lane then sums other weights than fq_dot_fmt's, so a
// row's bits depend on FQ_WIDE (and on nothing else: any row count, chunk or build gives a
// row the same operations in the same order). FQ_WIDE_SLICES: the 32-weight slices of its
// R rows a warp loads at once.
#ifndef FQ_WIDE
#define FQ_WIDE 0
#endif
#ifndef FQ_WIDE_SLICES
#define FQ_WIDE_SLICES 4
#endif
template <int FMT, int K>
__host__ __device__ constexpr bool fq_wide() {
  return FQ_WIDE > 0 && (FMT == 4 || FMT == 6 || FMT == 8) && K >= FQ_WIDE && K % 32 == 0;
}

template <int BITS>
struct FqWideSlice {
  static constexpr int GROUPS = BITS == 6 ? 2 : 1;  // groups of 16: weights 0..15, 16..31
  uint32_t v[BITS];
  float s[GROUPS], b[GROUPS];

  // weights k .. k + 31 of row r (k a multiple of 32)
  __device__ __forceinline__ void load(const FqPart& p, int r, int k) {
    const uint32_t* w = p.w + (size_t)r * p.row_words + k / 32 * BITS;
    if constexpr (BITS % 4 == 0) {
#pragma unroll
      for (int i = 0; i < BITS / 4; ++i) {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(w) + i);
        v[4 * i] = a.x; v[4 * i + 1] = a.y; v[4 * i + 2] = a.z; v[4 * i + 3] = a.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < BITS / 2; ++i) {
        const uint2 a = __ldg(reinterpret_cast<const uint2*>(w) + i);
        v[2 * i] = a.x; v[2 * i + 1] = a.y;
      }
    }
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
      const size_t at = (size_t)r * p.gpr + ((k + 16 * g) >> p.shift);
      s[g] = __uint_as_float(__ldg(p.s + at));
      b[g] = __uint_as_float(__ldg(p.b + at));
    }
  }
  // weights k + 8T .. k + 8T + 7 as float32 (FqSlice<BITS>::decode's operations)
  template <int T>
  __device__ __forceinline__ void decode(float* out) const {
    constexpr int G = GROUPS == 2 && T >= 2 ? 1 : 0;
    constexpr unsigned int MASK = (1u << BITS) - 1u;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int at = (8 * T + i) * BITS, w = at / 32, sh = at % 32;
      unsigned int q = v[w] >> sh;
      if (sh + BITS > 32) q |= v[w + 1] << (32 - sh);
      out[i] = __fmaf_rn(s[G], fq_small_float(q & MASK), b[G]);
    }
  }
};

// The wide dot product: fq_dot_fmt's contract (acc, ss, SCALED) over 16-byte slices, each
// decoded as used, 8 weights at a time in order
template <int BITS, int K, int R, int G, bool SCALED, bool SS>
__device__ __forceinline__ void fq_dot_wide(
    const FqPart& p, const int (&rows)[R], const float* norm, const FqX& x, int M,
    float (&acc)[G][R], float (&ss)[G]) {
  constexpr int IT = (K + 1023) / 1024;
  constexpr int CH0 = R >= FQ_WIDE_SLICES ? 1 : FQ_WIDE_SLICES / R;
  constexpr int CH = CH0 < IT ? CH0 : IT;
  const int lane = threadIdx.x % 32;
  fq_dot_zero(acc, ss);
#pragma unroll 1
  for (int c0 = 0; c0 < IT; c0 += CH) {
    FqWideSlice<BITS> cur[R][CH];
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int k = (c0 + j) * 1024 + lane * 32;
      if (c0 + j < IT && k < K) {
#pragma unroll
        for (int r = 0; r < R; ++r) cur[r][j].load(p, rows[r], k);
      }
    }
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int k0 = (c0 + j) * 1024 + lane * 32;
      if (c0 + j < IT && k0 < K) {
#pragma unroll
        for (int t = 0; t < 4; ++t) {  // weights k .. k + 7 of each row, then each row of x
          const int k = k0 + 8 * t;
          float nv[8], w[R][8];
          if (SCALED) fs_load8_ro(norm + k, nv);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float d[8];
            if (t == 0) cur[r][j].template decode<0>(d);
            else if (t == 1) cur[r][j].template decode<1>(d);
            else if (t == 2) cur[r][j].template decode<2>(d);
            else cur[r][j].template decode<3>(d);
#pragma unroll
            for (int i = 0; i < 8; ++i) w[r][i] = SCALED ? __fmul_rn(d[i], nv[i]) : d[i];
          }
#pragma unroll
          for (int m = 0; m < G; ++m) {
            if (m < M) {
              float xv[8];
              x.load8(m * K + k, xv);
              if (SS) {
#pragma unroll
                for (int i = 0; i < 8; ++i) ss[m] = __fmaf_rn(xv[i], xv[i], ss[m]);
              }
#pragma unroll
              for (int r = 0; r < R; ++r) {
                float sum = 0.f;
#pragma unroll
                for (int i = 0; i < 8; ++i) sum = __fmaf_rn(xv[i], w[r][i], sum);
                acc[m][r] = __fadd_rn(acc[m][r], sum);
              }
            }
          }
        }
      }
    }
  }
  fq_dot_total<SS>(M, acc, ss);
}

// FQ_INT8 (a row length, 0: off): dot products over rows of at least FQ_INT8 weights (K a
// multiple of 32) take x rounded to int8 in blocks of 32, as the CPU path's int8 kernels
// and llama.cpp do (kernels/int8_ref.py: d = max|x| / 127, xq = round-half-even(x / d)), and
// meet 4- and 6-bit rows four weights a dp4a; a lane's 8 weights (one group) then cost one
// float multiply-add for the scale and one for the bias (b * d * sum(xq)). Each block
// stages its rows of x that way itself (fq_stage_i8), in passes of the rows that fit its
// shared memory (fq_stage_pass: a phase over such rows always stages int8, so fq_dot
// compiles no float code for these formats there); other formats in such a phase read float
// x from L2. A row's bits depend on FQ_INT8 (and FQ_INT8_RESIDUAL) and on nothing else: any
// row count, pass or chunk gives a row the same operations. FQ_INT8_RESIDUAL 0 keeps float
// x in the residual phases (o, down, a hybrid's out_proj: FQ_ROLE_O and _DOWN), whose float
// dot product has no norm to fold in; the phases a norm precedes (qkv, gate_up, the head)
// take int8.
#ifndef FQ_INT8
#define FQ_INT8 0
#endif
#ifndef FQ_INT8_RESIDUAL
#define FQ_INT8_RESIDUAL 1
#endif
// the matrices' roles (fq_dot's dispatch below)
#define FQ_ROLE_QKV 0
#define FQ_ROLE_O 1
#define FQ_ROLE_GATE_UP 2
#define FQ_ROLE_DOWN 3
#define FQ_ROLE_HEAD 4
template <int K, int ROLE>
__host__ __device__ constexpr bool fq_int8() {
  const bool residual = ROLE == FQ_ROLE_O || ROLE == FQ_ROLE_DOWN;
  return FQ_INT8 > 0 && K >= FQ_INT8 && K % 32 == 0 && (FQ_INT8_RESIDUAL || !residual);
}
template <int FMT>
__host__ __device__ constexpr bool fq_int8_fmt() {  // affine or K-quant, 4 or 6 bits
  return FMT == 4 || FMT == 6 || FMT == (FQ_KMIN | 4) || FMT == (FQ_KSIGNED | 6);
}
// shared memory a staged row takes: K int8s, K / 32 scales, the 8 warps' parts of its sum of
// squares
template <int K>
__host__ __device__ constexpr int fq_int8_row_bytes() {
  return K + K / 8 + 4 * FD_WARPS;
}
// rows of x a phase over rows of K stages at once: a multiple of G (a pass's rows), all of
// the build's MAXM where float x is staged (one pass; fq_stage's own limit applies)
template <int K, int G, int MAXM_, int ROLE>
__host__ __device__ constexpr int fq_pass_rows() {
  if (!fq_int8<K, ROLE>()) return MAXM_;
  constexpr int fit = 4 * FQ_SMEM_X / fq_int8_row_bytes<K>() / G * G;
  return fit < MAXM_ ? fit : MAXM_;
}

// an integer below 2^22 in magnitude as a float by its exponent bits (no I2F)
__device__ __forceinline__ float fq_int_float(int d) {
  return __fsub_rn(__int_as_float(0x4B400000 + d), 12582912.0f);
}

// 16 bytes from global memory to shared memory, through L2 only; fs_copy_wait: every copy
// this thread issued has landed (the block's barrier then publishes them)
__device__ __forceinline__ void fs_copy16(float* sm, const float* g) {
#if __CUDA_ARCH__ >= 800
  const unsigned int at = static_cast<unsigned int>(__cvta_generic_to_shared(sm));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(at), "l"(g) : "memory");
#else
  *reinterpret_cast<float4*>(sm) = __ldcg(reinterpret_cast<const float4*>(g));
#endif
}
__device__ __forceinline__ void fs_copy_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Chunk c (x_8c .. x_8c+7 of row m, in v) rounded to int8 into q and its block's scale into
// d: with `norm`, v * norm is rounded and the sum of squares of v as given is added to sq.
// The 4 lanes of a block of 32 call it together.
template <int K>
__device__ __forceinline__ void fq_round8(float (&v)[8], const float* norm, int m, int c,
                                          float& sq, uint32_t* q, float* d) {
  if (norm) {
#pragma unroll
    for (int j = 0; j < 8; ++j) sq = __fmaf_rn(v[j], v[j], sq);
    float nv[8];
    fs_load8_ro(norm + 8 * c, nv);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __fmul_rn(v[j], nv[j]);
  }
  float a = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) a = fmaxf(a, fabsf(v[j]));
  const unsigned int four = __activemask();  // a block's 4 lanes are active together
  a = fmaxf(a, __shfl_xor_sync(four, a, 1));
  a = fmaxf(a, __shfl_xor_sync(four, a, 2));
  const float dd = __fdiv_rn(a, 127.f);
  const float inv = dd != 0.f ? __frcp_rn(dd) : 0.f;  // 1 / dd, correctly rounded
  uint32_t even = 0, odd = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t e = __float2int_rn(__fmul_rn(v[2 * j], inv));
    const uint32_t o = __float2int_rn(__fmul_rn(v[2 * j + 1], inv));
    even |= (e & 255u) << (8 * j);
    odd |= (o & 255u) << (8 * j);
  }
  q[m * (K / 4) + 2 * c] = even;
  q[m * (K / 4) + 2 * c + 1] = odd;
  if (c % 4 == 0) d[m * (K / 32) + c / 4] = dd;
}

// Rows p0 .. p0 + n of x [., K] into `sm` in int8 (every thread of the block calls it, past
// the barrier that published x): with `norm`, x * norm[k] is rounded (a norm's weight, as
// fq_dot's SCALED multiplies the weights by it) and the sum of squares of x as given is kept
// in its warps' parts (fq_dot_i8 adds them up); without, neither (no norm follows). Each
// row's threads, chunks and sums are the same whatever n: its bits do not depend on the pass.
// Thread t rounds chunks t, t + T, ... of a row, in that order. (Copying a row into shared
// memory by cp.async before rounding it was slower than rounding once in the producing
// phase, FQ_INT8_ONCE, and no faster a step: docs/BENCHMARKS.md, session 44.)
template <int K>
__device__ __forceinline__ FqX fq_stage_i8(const float* x, int p0, int n, const float* norm,
                                           float* sm) {
  static_assert(K % 32 == 0, "int8 x: blocks of 32");
  unsigned char* bytes = reinterpret_cast<unsigned char*>(sm);
  uint32_t* q = reinterpret_cast<uint32_t*>(bytes);
  float* d = reinterpret_cast<float*>(bytes + (size_t)n * K);
  float* parts = d + n * (K / 32);  // [n, FD_WARPS]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int T = FD_WARPS * 32;          // the block's threads (StepKernel's THREADS)
  constexpr int PER = (K / 8 + T - 1) / T;  // a thread's chunks of 8 in a row
  for (int m = 0; m < n; ++m) {
    const float* row = x + (size_t)(p0 + m) * K;
    float sq = 0.f;
#pragma unroll 1
    for (int i = 0; i < PER; ++i) {
      const int c = threadIdx.x + i * T;  // 4 lanes a block of 32
      if (c < K / 8) {
        float v[8];
        fs_load8_cg(row + 8 * c, v);
        fq_round8<K>(v, norm, m, c, sq, q, d);
      }
    }
    if (norm) {
      sq = fd_warp_sum(sq);
      if (lane == 0) parts[m * FD_WARPS + warp] = sq;
    }
  }
  __syncthreads();
  FqX out{x + (size_t)p0 * K, sm, 0, 0};
  out.q8 = q, out.d8 = d, out.ss8 = parts, out.k8 = K;
  return out;
}

// FQ_INT8_ONCE 1: the residual phases' x in int8 is rounded once, by the phase that writes
// it, into global memory (fused_step.cu's oq8 / od8, aq8 / ad8), and each block of o and
// down copies those bytes instead of rounding its own copy (fq_stage_i8 rounds the same x
// in every block: the 1B shape's down phase took 7.0 us a layer more than on float x,
// docs/BENCHMARKS.md, session 42). The attention output's rounding is a warp's (a head's
// 32 dims); the MLP's activation's a block's, which then takes whole blocks of 32 outputs
// in gate_up. The bytes, scales and so a row's bits are fq_stage_i8's.
#ifndef FQ_INT8_ONCE
#define FQ_INT8_ONCE 0
#endif
// where x_k of a row of int8 x lies among the row's bytes: fq_round8's words hold a chunk of
// 8's even elements, then its odd ones
__device__ __forceinline__ int fq_i8_byte(int k) {
  return (k & ~7) + 4 * (k & 1) + ((k & 7) >> 1);
}

// Every lane of a warp holds x_k of one block of 32 (k = k0 + lane, k0 a multiple of 32, of
// a row whose int8 bytes start at q and scales at d): rounded as fq_round8 rounds it
__device__ __forceinline__ void fq_round_warp(float v, int k0, unsigned char* q, float* d) {
  float a = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  const float dd = __fdiv_rn(a, 127.f);
  const float inv = dd != 0.f ? __frcp_rn(dd) : 0.f;
  const int lane = threadIdx.x % 32;
  q[fq_i8_byte(k0 + lane)] = static_cast<unsigned char>(__float2int_rn(__fmul_rn(v, inv)) & 255);
  if (lane == 0) d[k0 / 32] = dd;
}

// Rows p0 .. p0 + n of x in int8 as FQ_INT8_ONCE's producers left them (q8: K bytes a row,
// d8: K / 32 scales) into `sm` in fq_stage_i8's layout (no sum of squares: no norm follows)
template <int K>
__device__ __forceinline__ FqX fq_stage_once(const float* x, const unsigned char* q8,
                                             const float* d8, int p0, int n, float* sm) {
  static_assert(K % 32 == 0, "int8 x: blocks of 32");
  unsigned char* bytes = reinterpret_cast<unsigned char*>(sm);
  float* d = reinterpret_cast<float*>(bytes + (size_t)n * K);
  const unsigned char* from = q8 + (size_t)p0 * K;
  for (int u = threadIdx.x; u < n * K / 16; u += blockDim.x)
    fs_copy16(reinterpret_cast<float*>(bytes + 16 * u), reinterpret_cast<const float*>(from + 16 * u));
  for (int i = threadIdx.x; i < n * (K / 32); i += blockDim.x) d[i] = __ldcg(d8 + (size_t)p0 * (K / 32) + i);
  fs_copy_wait();
  __syncthreads();
  FqX out{x + (size_t)p0 * K, sm, 0, 0};
  out.q8 = reinterpret_cast<const uint32_t*>(bytes), out.d8 = d, out.ss8 = nullptr, out.k8 = K;
  return out;
}

// A phase's x for rows p0 .. of a pass: int8 (fq_stage_i8, `norm` folded in) where rows of
// K take it, else fq_stage's float copy of every row (then p0 is 0: one pass)
template <int K, int P, int ROLE>
__device__ __forceinline__ FqX fq_stage_pass(const float* x, int M, int p0, const float* norm,
                                             float* sm) {
  if constexpr (fq_int8<K, ROLE>()) {
    return fq_stage_i8<K>(x, p0, min(P, M - p0), norm, sm);
  } else {
    return fq_stage(x, M * K, sm);
  }
}

// after a pass over rows [p0, p0 + P): shared memory is free to stage the next
__device__ __forceinline__ void fq_pass_done(int p0, int P, int M) {
  if (p0 + P < M) __syncthreads();
}

// 8 weights of 6 bits from their 48 bits (lo: bits 0..31, hi: 32..47; hi's upper bits are
// ignored) as the two words of bytes dp4a takes: the even weights (e) and the odd ones (o)
__device__ __forceinline__ void fq_six_bytes(uint32_t lo, uint32_t hi, uint32_t& e, uint32_t& o) {
  e = (lo & 0x3Fu) | ((lo >> 4) & 0x3F00u) | ((lo >> 8) & 0x3F0000u) | ((hi << 20) & 0x3F000000u);
  o = ((lo >> 6) & 0x3Fu) | ((lo >> 10) & 0x3F00u) | (__funnelshift_r(lo, hi, 14) & 0x3F0000u) |
      ((hi << 14) & 0x3F000000u);
}

// Eight weights k .. k + 7 of a 4- or 6-bit slice against 8 int8s of x (xe: x_k, x_k+2,
// x_k+4, x_k+6; xo: the odd ones): the integer sum of q * xq
template <int FMT>
__device__ __forceinline__ int fq_slice_i8(const FqSlice<FMT>& q, int k, uint32_t xe,
                                           uint32_t xo) {
  uint32_t e, o;
  if constexpr (FqSlice<FMT>::BITS == 4) {
    e = q.v[0] & 0x0F0F0F0Fu;
    o = (q.v[0] >> 4) & 0x0F0F0F0Fu;
  } else {
    const int sh = (k * 6) % 32;
    unsigned long long bits = (q.v[0] | (static_cast<unsigned long long>(q.v[1]) << 32)) >> sh;
    if (sh) bits |= static_cast<unsigned long long>(q.v[2]) << (64 - sh);
    fq_six_bytes(static_cast<uint32_t>(bits), static_cast<uint32_t>(bits >> 32), e, o);
  }
  const int even = __dp4a(static_cast<int>(e), static_cast<int>(xe), 0);
  return __dp4a(static_cast<int>(o), static_cast<int>(xo), even);
}

// fq_dot_fmt with x in int8 (x.q8): the same lane map and loads; per lane, slice and row of
// x, acc = fma(s * d, sum(q xq), acc) then acc = fma(b, d * sum(xq), acc); the sum of
// squares is the staged row's (fq_stage_i8). SCALED's norm is in the staged x already.
template <int FMT, int K, int R, int G, bool SS>
__device__ __forceinline__ void fq_dot_i8(
    const FqPart& p, const int (&rows)[R], const FqX& x, int M, float (&acc)[G][R],
    float (&ss)[G]) {
  constexpr int IT = (K + 255) / 256;
  constexpr int CH = fq_chunk(R, IT);
  const int lane = threadIdx.x % 32;
  fq_dot_zero(acc, ss);
#pragma unroll 1
  for (int c0 = 0; c0 < IT; c0 += CH) {
    FqSlice<FMT> cur[R][CH];
    fq_load_chunk<FMT, K, R, CH>(p, rows, c0, cur);
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int k = (c0 + j) * 256 + lane * 8;
      if (c0 + j < IT && k < K) {
#pragma unroll
        for (int m = 0; m < G; ++m) {
          if (m < M) {
            const uint2 xq = *reinterpret_cast<const uint2*>(x.q8 + (m * K + k) / 4);
            const float dx = x.d8[(m * K + k) / 32];
            const int xsum = __dp4a(static_cast<int>(xq.y), 0x01010101,
                                    __dp4a(static_cast<int>(xq.x), 0x01010101, 0));
            const float xb = __fmul_rn(dx, fq_int_float(xsum));
#pragma unroll
            for (int r = 0; r < R; ++r) {
              const int dot = fq_slice_i8(cur[r][j], k, xq.x, xq.y);
              acc[m][r] = __fmaf_rn(__fmul_rn(cur[r][j].s, dx), fq_int_float(dot), acc[m][r]);
              acc[m][r] = __fmaf_rn(cur[r][j].b, xb, acc[m][r]);
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < G; ++m) {
    if (m < M) {
      if (SS) {
#pragma unroll
        for (int w = 0; w < FD_WARPS; ++w) ss[m] = __fadd_rn(ss[m], x.ss8[m * FD_WARPS + w]);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) acc[m][r] = fd_warp_sum(acc[m][r]);
    }
  }
}

// fq_dot_fmt for a part of format `fmt`: one branch per format the matrices of ROLE hold
// (FQ_ROLE_QKV, _O, _GATE_UP, _DOWN: layer l's 4l .. 4l + 3 in every layer; FQ_ROLE_HEAD:
// the LM head and the embedding table), the lists defined before this header by
// kernels/fused_step_cuda.py: a phase compiles only the dot products its matrices can
// need (the Q8_0 table's and Q6_K's branches in every phase cost registers and spills).
template <int K, int R, int G, bool SCALED, bool SS, int ROLE>
__device__ __forceinline__ void fq_dot(
    int fmt, const FqPart& p, const int (&rows)[R], const float* norm, const FqX& x, int M,
    float (&acc)[G][R], float (&ss)[G]) {
#define FQ_CASE(F)                                                               \
  if (fmt == F) {                                                                \
    if constexpr (fq_int8<K, ROLE>() && fq_int8_fmt<F>()) {                      \
      fq_dot_i8<F, K, R, G, SS>(p, rows, x, M, acc, ss);                         \
    } else if constexpr (fq_wide<F, K>()) {                                      \
      fq_dot_wide<F, K, R, G, SCALED, SS>(p, rows, norm, x, M, acc, ss);         \
    } else {                                                                     \
      fq_dot_fmt<F, K, R, G, SCALED, SS>(p, rows, norm, x, M, acc, ss);          \
    }                                                                            \
    return;                                                                      \
  }
  if constexpr (ROLE == FQ_ROLE_QKV) {
    FQ_FORMATS_QKV(FQ_CASE)
  } else if constexpr (ROLE == FQ_ROLE_O) {
    FQ_FORMATS_O(FQ_CASE)
  } else if constexpr (ROLE == FQ_ROLE_GATE_UP) {
    FQ_FORMATS_GATE_UP(FQ_CASE)
  } else if constexpr (ROLE == FQ_ROLE_DOWN) {
    FQ_FORMATS_DOWN(FQ_CASE)
  } else {
    FQ_FORMATS_HEAD(FQ_CASE)
  }
#undef FQ_CASE
}

// FQ_SPREAD 1: a verify's groups of G rows are work units of their own, dealt to the
// warps with the phase's outputs (unit u: output item u % items, the rows of group
// u / items), so a k-row verify keeps more warps busy where a phase has fewer items than
// the grid has warps; 0: a warp takes every row of its items, G at a time. A row's
// arithmetic is the same either way (one fq_dot over the same group of rows).
#ifndef FQ_SPREAD
#define FQ_SPREAD 0
#endif
struct FqUnits {
  int items, groups;
  __device__ __forceinline__ FqUnits(int items_, int M, int G)
      : items(items_), groups(FQ_SPREAD ? (M + G - 1) / G : 1) {}
  __device__ __forceinline__ int count() const { return items * groups; }
  // unit u's item, and its rows [lo, hi) (every row with one group)
  __device__ __forceinline__ int item(int u) const { return groups == 1 ? u : u % items; }
  __device__ __forceinline__ void rows(int u, int M, int G, int& lo, int& hi) const {
    lo = groups == 1 ? 0 : (u / items) * G;
    hi = groups == 1 ? M : min(M, lo + G);
  }
};

// y [M, N] = res + a [M, K] @ w.T for matrix `mat` (without RES, a @ w.T alone); output n
// by warp n of nw (from gw), G rows a pass (FQ_SPREAD: a group of rows a unit), a staged
// in `sm` (in int8, fq_pass_rows' rows at a time: MAXM_ is the build's most rows; with a8
// (FQ_INT8_ONCE), a's int8 rows are copied as their producer rounded them, ad8 their scales)
template <int K, int N, int G, int ROLE, int MAXM_, bool RES = true>
__device__ __forceinline__ void fq_residual_phase(
    const FqTable& t, int mat, const float* a, const float* res, float* y, int M, int gw,
    int nw, float* sm, const unsigned char* a8 = nullptr, const float* ad8 = nullptr) {
  constexpr int P = fq_pass_rows<K, G, MAXM_, ROLE>();
  static_assert(P >= G, "a pass stages a dot product's rows of x");
  const int lane = threadIdx.x % 32;
  const FqUnits units(N, M, G);
  for (int p0 = 0; p0 < M; p0 += P) {
    FqX xa;  // a's rows in int8 as their producer rounded them (a8), or staged here
    if constexpr (fq_int8<K, ROLE>()) {
      xa = a8 ? fq_stage_once<K>(a, a8, ad8, p0, min(P, M - p0), sm)
              : fq_stage_pass<K, P, ROLE>(a, M, p0, nullptr, sm);
    } else {
      xa = fq_stage_pass<K, P, ROLE>(a, M, p0, nullptr, sm);
    }
    for (int u = gw; u < units.count(); u += nw) {
      const int n = units.item(u);
      int lo, hi;
      units.rows(u, M, G, lo, hi);
      FqPart p;
      int r;
      const int fmt = t.part(mat, n, p, r);
      const int rows[1] = {r};
      for (int m0 = max(lo, p0); m0 < min(hi, p0 + P); m0 += G) {
        float acc[G][1], ss[G];
        fq_dot<K, 1, G, false, false, ROLE>(fmt, p, rows, nullptr, xa.at((m0 - p0) * K),
                                            min(G, M - m0), acc, ss);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const int m = m0 + g;
          if (m < M && lane == 0)
            y[(size_t)m * N + n] = RES ? __fadd_rn(__ldcg(res + (size_t)m * N + n), acc[g][0]) : acc[g][0];
        }
      }
    }
    fq_pass_done(p0, P, M);
  }
}

// Rows ids[0 .. M) of matrix `mat` (the embedding table) as float32 into xs [M, K], times
// `scale` (Gemma's sqrt(D); 1: as stored)
template <int K>
__device__ __forceinline__ void fq_gather_rows(
    const FqTable& t, int mat, const int* ids, int M, float* xs, float scale) {
  constexpr int S = K / 8;  // slices a row
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < M * S; i += gridDim.x * blockDim.x) {
    const int m = i / S, k = (i % S) * 8;
    FqPart p;
    int r;
    const int fmt = t.part(mat, ids[m], p, r);
    float out[8];
#define FQ_CASE(F)        \
  if (fmt == F) {         \
    FqSlice<F> q;         \
    q.load(p, r, k);      \
    q.decode(k, out);     \
  }
    FQ_FORMATS_HEAD(FQ_CASE)
#undef FQ_CASE
#pragma unroll
    for (int j = 0; j < 8; ++j) xs[(size_t)m * K + k + j] = scale == 1.0f ? out[j] : __fmul_rn(out[j], scale);
  }
}

// FQ_L1_PREFETCH 1: before the barrier ahead of a phase, each warp asks for the first
// 2,048 weights of the row it takes first in that phase (and their scales and biases) in
// its SM's L1, a line a lane, so their latency overlaps the barrier's wait (weights are
// read-only: L1 holds no stale copy). Which loads run, and their values, are unchanged.
#ifndef FQ_L1_PREFETCH
#define FQ_L1_PREFETCH 0
#endif
__device__ __forceinline__ void fq_prefetch_row(const FqTable& t, int mat, int row) {
  if (!FQ_L1_PREFETCH) return;
  FqPart p;
  int r;
  const int fmt = t.part(mat, row, p, r);
  const int lane = threadIdx.x % 32;
  const bool factors = fmt >= FQ_KMIN, affine = fmt <= 8 || factors;
  const int bits = affine ? fmt & 15 : (fmt == FQ_F32 ? 32 : 16);
  const char* w = reinterpret_cast<const char*>(p.w + (size_t)r * p.row_words);
  const int wbytes = min(p.row_words * 4, 2048 * bits / 8);  // at most 16 lines
  if (lane < 16 && lane * 128 < wbytes)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(w + lane * 128));
  if (affine && lane >= 16) {  // 8 lines of scales (or codes), then 8 of biases (or pairs)
    const int groups = min(p.gpr, 2048 >> p.shift), i = lane % 8;
    const size_t g0 = (size_t)r * p.gpr;  // a factor part: 2 bytes a group, 4 a super-block
    const char* g = lane < 24 ? reinterpret_cast<const char*>(p.s) + g0 * (factors ? 2 : 4)
                              : reinterpret_cast<const char*>(p.b) + (factors ? (g0 >> (8 - p.shift)) * 4 : g0 * 4);
    const int gbytes = lane < 24 ? groups * (factors ? 2 : 4) : (factors ? (groups >> (8 - p.shift)) * 4 + 4 : groups * 4);
    if (i * 128 < gbytes)
      asm volatile("prefetch.global.L1 [%0];" ::"l"(g + i * 128));
  }
}

// A RoPE pair (s0, s1) rotated to position `pos` at inverse frequency f
__device__ __forceinline__ void fs_rotate(float& s0, float& s1, int pos, float f) {
  float sn, cs;
  sincosf(static_cast<float>(pos) * f, &sn, &cs);
  const float r0 = s0 * cs - s1 * sn;
  s1 = s0 * sn + s1 * cs;
  s0 = r0;
}

// The MLP's activation of its gate: ACT 0 SiLU, 1 GELU's tanh approximation (Gemma 3)
template <int ACT>
__device__ __forceinline__ float fs_act(float x) {
  if (ACT == 0) return x / (1.0f + expf(-x));
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(inner));
}

// Gemma 3's norm after a block, in place: y = res + rms_norm(y) * w, rows [M, D], a warp a
// row (a lane writes only the elements it read; y and res come from other blocks)
template <int D>
__device__ __forceinline__ void fs_post_norm(
    float* y, const float* res, const float* w, int M, int gw, int nw, float eps) {
  const int lane = threadIdx.x % 32;
  for (int m = gw; m < M; m += nw) {
    float* row = y + (size_t)m * D;
    const float* r = res + (size_t)m * D;
    float ss = 0.f;
    for (int i = lane; i < D; i += 32) {
      const float v = __ldcg(row + i);
      ss = __fmaf_rn(v, v, ss);
    }
    ss = fd_warp_sum(ss);
    const float rinv = 1.0f / sqrtf(ss / D + eps);
    for (int i = lane; i < D; i += 32)
      row[i] = __fadd_rn(__ldcg(r + i), __fmul_rn(__fmul_rn(__ldcg(row + i), rinv), __ldg(w + i)));
  }
}

// An attention output times the sigmoid of its gate (Qwen3.5's gated attention), or as is
template <bool GATED>
__device__ __forceinline__ float fs_gated(float o, const float* gate, int i) {
  if (!GATED) return o;
  return __fmul_rn(o, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__ldcg(gate + i)))));
}

__device__ __forceinline__ void fs_prefetch_l2(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  const size_t stride = (size_t)gridDim.x * blockDim.x * 128;
  for (size_t off = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 128; off < bytes;
       off += stride)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));
}

// Grid-wide barrier on a counter that grows by gridDim.x a phase (zeroed each launch):
// the block's writes are ordered before thread 0's arrival by the block barrier, as in
// cooperative groups. flags[1] records a timeout (blocks not co-resident) instead of a
// hang. FQ_BARRIER 0 arrives after a full fence and leaves after another; 1 arrives with
// a release add and waits with acquire loads (the same ordering, without the fences'
// wait for every outstanding access).
#ifndef FQ_BARRIER
#define FQ_BARRIER 0
#endif
__device__ __forceinline__ unsigned int fs_load_acquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void fs_grid_sync(unsigned int* flags, unsigned int epoch) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int target = epoch * gridDim.x;
    const long long start = clock64();
    if (FQ_BARRIER) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(flags) : "memory");
      while (fs_load_acquire(flags) < target) {
        if (fs_load_acquire(flags + 1)) break;
        if (clock64() - start > (1ll << 32)) { atomicExch(flags + 1, 1u); break; }
      }
    } else {
      __threadfence();
      atomicAdd(flags, 1u);
      while (*reinterpret_cast<volatile unsigned int*>(flags) < target) {
        if (*reinterpret_cast<volatile unsigned int*>(flags + 1)) break;
        if (clock64() - start > (1ll << 32)) { atomicExch(flags + 1, 1u); break; }
      }
      __threadfence();
    }
  }
  __syncthreads();
}
