// Device helpers the five fused decode kernels share (fused_step.cuh builds on them):
// wide loads, a warp sum, the q/k/v pair mapping, RMS of rows, rows of dot products.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define FD_WARPS 8
#define FD_MAXM 16
#define FD_FULL 0xffffffffu

__device__ __forceinline__ void fd_load8(const float* p, float* out) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

template <typename W>
__device__ __forceinline__ void fd_load8(const W* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const W* v = reinterpret_cast<const W*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = static_cast<float>(v[i]);
}

__device__ __forceinline__ float fd_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FD_FULL, v, o);
  return v;
}

// Outputs n0, n1 of the fused q/k/v projection that pair p computes: a RoPE pair of a q or
// k head (fi = its frequency index) or, past those, two adjacent v features (fi = -1).
template <int H, int HKV, int DH, bool TRADITIONAL>
__device__ __forceinline__ void fd_qkv_pair(int p, int& n0, int& n1, int& fi) {
  constexpr int HALF = DH / 2, ROPED_PAIRS = (H + HKV) * HALF;
  if (p < ROPED_PAIRS) {
    const int head = p / HALF, i = p % HALF;
    n0 = head * DH + (TRADITIONAL ? 2 * i : i);
    n1 = n0 + (TRADITIONAL ? 1 : HALF);
    fi = i;
  } else {
    n0 = (H + HKV) * DH + 2 * (p - ROPED_PAIRS);
    n1 = n0 + 1;
    fi = -1;
  }
}

// 1 / rms of each of the M rows of x [M, K] into shared rinv; the whole block takes part.
__device__ __forceinline__ void fd_row_rinv(
    const float* x, int M, int K, float eps, float* rinv) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int m = warp; m < M; m += FD_WARPS) {
    float s = 0.f;
    for (int k = lane; k < K; k += 32) {
      const float v = x[m * K + k];
      s += v * v;
    }
    s = fd_warp_sum(s);
    if (lane == 0) rinv[m] = 1.0f / sqrtf(s / K + eps);
  }
  __syncthreads();
}

// acc[m] += sum_k x[m, k] * scale[k] * w[k] over this lane's k (stride 256, 8 at a time).
template <typename W, int K, bool SCALED>
__device__ __forceinline__ void fd_dot_rows(
    const float* x, int M, const float* scale, const W* w, float* acc) {
  const int lane = threadIdx.x % 32;
  for (int k = lane * 8; k < K; k += 256) {
    float wv[8];
    fd_load8(w + k, wv);
    if (SCALED) {
      float sv[8];
      fd_load8(scale + k, sv);
#pragma unroll
      for (int i = 0; i < 8; ++i) wv[i] *= sv[i];
    }
#pragma unroll
    for (int m = 0; m < FD_MAXM; ++m) {
      if (m < M) {
        float xv[8];
        fd_load8(x + m * K + k, xv);
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) s += xv[i] * wv[i];
        acc[m] += s;
      }
    }
  }
}
