// Debug probe: the one-launch step's dot products alone (kernels/cuda/fused_step.cuh's
// fq_dot), timed on the GPU without MLX: one launch a phase-shaped matrix of random words,
// the build's knobs given by -D (FQ_WIDE, FQ_WIDE_SLICES, FQ_SWIZZLE, FQ_SLICES, FQ_STREAM,
// BLOCKS). Each matrix has COPIES copies laid out one after another, past the L2, and each
// launch reads the next, as a step's phases read layer after layer. Prints a JSON line a
// matrix: the median launch in microseconds and its table bytes over that time.
//   nvcc -O3 -std=c++17 -arch=sm_90 -DFQ_WIDE=2048 -I kernels/cuda bench/gpu/products_probe.cu
//   (bench/gpu/products_probe.sh builds and runs each variant)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>

#define FQ_FORMATS_QKV(X) X(4) X(6)
#define FQ_FORMATS_O(X) X(4)
#define FQ_FORMATS_GATE_UP(X) X(4)
#define FQ_FORMATS_DOWN(X) X(4) X(6)
#define FQ_FORMATS_HEAD(X) X(6)
#ifndef FQ_SMEM_X
#define FQ_SMEM_X 16384
#endif
#ifndef BLOCKS
#define BLOCKS 2
#endif
#include "fused_decode.cuh"
#include "fused_step.cuh"

constexpr int THREADS = 256;
constexpr int COPIES = 8;

// y[n] = w[n] . x for rows n of matrix `mat`, R rows a warp (gate/up and q/k/v take 2)
template <int K, int R, int ROLE>
__global__ void __launch_bounds__(THREADS, BLOCKS)
    products(FqTable t, int mat, const float* x, float* y, int N) {
  extern __shared__ __align__(16) float sm[];
  const int lane = threadIdx.x % 32;
  const int gw = blockIdx.x * (THREADS / 32) + threadIdx.x / 32, nw = gridDim.x * (THREADS / 32);
  const FqX xa = fq_stage(x, K, sm);
  for (int n = gw * R; n < N; n += nw * R) {
    FqPart p;
    int r;
    const int fmt = t.part(mat, n, p, r);
    int rows[R];
#pragma unroll
    for (int i = 0; i < R; ++i) rows[i] = r + i;
    float acc[1][R], ss[1];
    fq_dot<K, R, 1, false, false, ROLE>(fmt, p, rows, nullptr, xa, 1, acc, ss);
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < R; ++i) y[n + i] = acc[0][i];
    }
  }
}

#define CHECK(call)                                                              \
  do {                                                                           \
    cudaError_t e = (call);                                                      \
    if (e != cudaSuccess) {                                                      \
      fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e));                 \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

template <int K, int R, int ROLE>
void probe(const char* name, int N, int bits, int group, int sms) {
  const int shift = __builtin_ctz(group), gpr = K / group, row_words = K * bits / 32;
  const size_t words = (size_t)N * row_words, groups = (size_t)N * gpr;
  std::vector<int64_t> meta(COPIES * FQ_PARTS * FQ_FIELDS, 0);
  for (int c = 0; c < COPIES; ++c) {
    for (int part = 0; part < FQ_PARTS; ++part) {
      int64_t* f = &meta[(c * FQ_PARTS + part) * FQ_FIELDS];
      if (part > 0) { f[FQ_ROW0] = int64_t(1) << 62; continue; }
      f[FQ_WORDS] = c * words; f[FQ_GROUPS] = c * groups; f[FQ_BIAS] = c * groups;
      f[FQ_ROW_WORDS] = row_words; f[FQ_FMT] = bits; f[FQ_SHIFT] = shift; f[FQ_GPR] = gpr;
    }
  }
  std::vector<uint32_t> hw(COPIES * words + 64), hs(COPIES * groups + 1), hb(COPIES * groups + 1);
  uint32_t seed = 12345u;
  for (auto& v : hw) { seed = seed * 1664525u + 1013904223u; v = seed; }
  for (size_t i = 0; i < hs.size(); ++i) {
    const float s = 0.01f * (1 + (i % 7)), b = -0.05f * (1 + (i % 5));
    memcpy(&hs[i], &s, 4); memcpy(&hb[i], &b, 4);
  }
  std::vector<float> hx(K);
  for (int i = 0; i < K; ++i) hx[i] = 0.001f * ((i * 37) % 101 - 50);
  int64_t* dmeta; uint32_t *dw, *ds, *db; float *dx, *dy;
  CHECK(cudaMalloc(&dmeta, meta.size() * 8));
  CHECK(cudaMalloc(&dw, hw.size() * 4));
  CHECK(cudaMalloc(&ds, hs.size() * 4));
  CHECK(cudaMalloc(&db, hb.size() * 4));
  CHECK(cudaMalloc(&dx, K * 4));
  CHECK(cudaMalloc(&dy, (size_t)N * 4));
  CHECK(cudaMemcpy(dmeta, meta.data(), meta.size() * 8, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dw, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(ds, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dx, hx.data(), K * 4, cudaMemcpyHostToDevice));
  const FqTable t{dmeta, dw, ds, db};
  const int smem = 4 * std::min(K, FQ_SMEM_X);
  CHECK(cudaFuncSetAttribute(products<K, R, ROLE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int grid = sms * BLOCKS;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> us;
  for (int i = 0; i < 20 * COPIES + 2 * COPIES; ++i) {
    CHECK(cudaEventRecord(a));
    products<K, R, ROLE><<<grid, THREADS, smem>>>(t, i % COPIES, dx, dy, N);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 2 * COPIES) us.push_back(ms * 1000.0f);  // the first rounds warm up
  }
  CHECK(cudaGetLastError());
  std::sort(us.begin(), us.end());
  const double med = us[us.size() / 2];
  const double bytes = (double)words * 4 + (double)groups * 8;
  std::vector<float> hy(4);
  CHECK(cudaMemcpy(hy.data(), dy, 16, cudaMemcpyDeviceToHost));
  printf("{\"matrix\": \"%s\", \"N\": %d, \"K\": %d, \"bits\": %d, \"group\": %d, \"rows_a_warp\": %d, "
         "\"median_us\": %.2f, \"min_us\": %.2f, \"tb_s\": %.3f, \"y0\": %.6g}\n",
         name, N, K, bits, group, R, med, us[0], bytes / med * 1e-6, hy[0]);
  cudaFree(dmeta); cudaFree(dw); cudaFree(ds); cudaFree(db); cudaFree(dx); cudaFree(dy);
}

int main() {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  printf("{\"build\": {\"FQ_WIDE\": %d, \"FQ_WIDE_SLICES\": %d, \"FQ_SWIZZLE\": %d, "
         "\"FQ_SLICES\": %d, \"FQ_STREAM\": %d, \"BLOCKS\": %d, \"SMS\": %d}}\n",
         FQ_WIDE, FQ_WIDE_SLICES, FQ_SWIZZLE, FQ_SLICES, FQ_STREAM, BLOCKS, sms);
  // Llama-3.1-8B's layer (Q4_K: 4 bits, groups of 32; Q6_K: 6 bits, groups of 16), its head
  probe<4096, 2, FQ_ROLE_QKV>("8b.qkv", 6144, 4, 32, sms);
  probe<4096, 1, FQ_ROLE_O>("8b.o", 4096, 4, 32, sms);
  probe<4096, 2, FQ_ROLE_GATE_UP>("8b.gate_up", 28672, 4, 32, sms);
  probe<14336, 1, FQ_ROLE_DOWN>("8b.down.q4", 4096, 4, 32, sms);
  probe<14336, 1, FQ_ROLE_DOWN>("8b.down.q6", 4096, 6, 16, sms);
  // Llama-3.2-1B's
  probe<2048, 2, FQ_ROLE_GATE_UP>("1b.gate_up", 16384, 4, 32, sms);
  probe<8192, 1, FQ_ROLE_DOWN>("1b.down.q4", 2048, 4, 32, sms);
  probe<2048, 2, FQ_ROLE_HEAD>("1b.head.q6", 32768, 6, 16, sms);  // a quarter of its vocabulary
  return 0;
}
