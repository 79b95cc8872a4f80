// Device code of the one-launch step (after fused_decode.cuh): register-held loads, the
// warp-wide dot products of a group of rows, the residual phase, L2 prefetch, grid barrier.

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

__device__ __forceinline__ void fs_load8_cg(const float* p, float* out) {
  const float4 a = __ldcg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldcg(reinterpret_cast<const float4*>(p + 4));
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

// Rows of a warp-wide dot product: lane `lane` holds slices k = it * 256 + lane * 8
// (8 elements each) of R weight rows of length K, all loaded before any is used.
template <typename W, int K, int R>
struct FsRows {
  static constexpr int IT = (K + 255) / 256;
  FsRaw<8 * sizeof(W)> w[R][IT];
  __device__ __forceinline__ void load(const W* const (&rows)[R]) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int it = 0; it < IT; ++it) {
      const int k = it * 256 + lane * 8;
      if (k < K) {
#pragma unroll
        for (int r = 0; r < R; ++r) w[r][it].load_ro(rows[r] + k);
      }
    }
  }
};

// The same slices of a float32 norm weight.
template <int K>
struct FsScale {
  static constexpr int IT = (K + 255) / 256;
  float v[IT][8];
  __device__ __forceinline__ void load(const float* scale) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int it = 0; it < IT; ++it) {
      const int k = it * 256 + lane * 8;
      if (k < K) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(scale + k));
        const float4 b = __ldg(reinterpret_cast<const float4*>(scale + k + 4));
        v[it][0] = a.x; v[it][1] = a.y; v[it][2] = a.z; v[it][3] = a.w;
        v[it][4] = b.x; v[it][5] = b.y; v[it][6] = b.z; v[it][7] = b.w;
      }
    }
  }
};

// Rows a dot product takes at once: their activation slices stay in registers (two, or
// one for long rows: more spill registers).
__host__ __device__ constexpr int fs_group(int K) { return (K + 255) / 256 > 6 ? 1 : 2; }

// Rows m0 .. m0 + G - 1 (those < M) of x [M, K] against a warp's R weight rows: acc[g][r]
// and, with SS, ss[g] = the row's sum of squares, as warp-wide totals. Per lane and slice
// s = sum_i x_i * w_i in order, acc += s, then a butterfly sum: the same operations for
// every row whatever M and G are, so a row's result does not depend on the others.
template <typename W, int K, int R, int G, bool SCALED, bool SS>
__device__ __forceinline__ void fs_dot_group(
    const FsRows<W, K, R>& rows, const FsScale<K>& sc, const float* x, int m0, int M,
    float (&acc)[G][R], float (&ss)[G]) {
  constexpr int IT = (K + 255) / 256;
  const int lane = threadIdx.x % 32;
  float xv[G][IT][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int it = 0; it < IT; ++it) {
      const int k = it * 256 + lane * 8;
      if (m0 + g < M && k < K) {
        fs_load8_cg(x + (size_t)(m0 + g) * K + k, xv[g][it]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) xv[g][it][i] = 0.f;
      }
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    ss[g] = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[g][r] = 0.f;
#pragma unroll
    for (int it = 0; it < IT; ++it) {
      if (it * 256 + lane * 8 < K) {
        if (SS) {
#pragma unroll
          for (int i = 0; i < 8; ++i) ss[g] += xv[g][it][i] * xv[g][it][i];
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float wv[8];
          fs_unpack<W, 8>(rows.w[r][it], wv);
          float s = 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) s += xv[g][it][i] * (SCALED ? wv[i] * sc.v[it][i] : wv[i]);
          acc[g][r] += s;
        }
      }
    }
    if (SS) ss[g] = fd_warp_sum(ss[g]);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[g][r] = fd_warp_sum(acc[g][r]);
  }
}

// y [M, N] = res + a [M, K] @ w [N, K].T, output n by warp n of nw (from gw)
template <typename W, int K, int N>
__device__ __forceinline__ void fs_residual_phase(
    const float* a, const W* w, const float* res, float* y, int M, int gw, int nw) {
  constexpr int G = fs_group(K);
  const FsScale<K> unscaled{};
  const int lane = threadIdx.x % 32;
  for (int n = gw; n < N; n += nw) {
    const W* src[1] = {w + (size_t)n * K};
    FsRows<W, K, 1> rows;
    rows.load(src);
    for (int m0 = 0; m0 < M; m0 += G) {
      float r[G], acc[G][1], ss[G];
#pragma unroll
      for (int g = 0; g < G; ++g) r[g] = m0 + g < M ? __ldcg(res + (size_t)(m0 + g) * N + n) : 0.f;
      fs_dot_group<W, K, 1, G, false, false>(rows, unscaled, a, m0, M, acc, ss);
#pragma unroll
      for (int g = 0; g < G; ++g)
        if (m0 + g < M && lane == 0) y[(size_t)(m0 + g) * N + n] = r[g] + acc[g][0];
    }
  }
}

__device__ __forceinline__ void fs_prefetch_l2(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  const size_t stride = (size_t)gridDim.x * blockDim.x * 128;
  for (size_t off = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 128; off < bytes;
       off += stride)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));
}

// Grid-wide barrier on a counter that grows by gridDim.x a phase (zeroed each launch):
// the block's writes are ordered before thread 0's fence by the block barrier, as in
// cooperative groups. flags[1] records a timeout (blocks not co-resident) instead of a
// hang.
__device__ __forceinline__ void fs_grid_sync(unsigned int* flags, unsigned int epoch) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(flags, 1u);
    const unsigned int target = epoch * gridDim.x;
    const long long start = clock64();
    while (*reinterpret_cast<volatile unsigned int*>(flags) < target) {
      if (*reinterpret_cast<volatile unsigned int*>(flags + 1)) break;
      if (clock64() - start > (1ll << 32)) { atomicExch(flags + 1, 1u); break; }
    }
    __threadfence();
  }
  __syncthreads();
}
