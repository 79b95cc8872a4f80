// Debug probe: the one-launch step's dot products alone (kernels/cuda/fused_step.cuh's
// fq_dot), timed on the GPU without MLX: one launch a phase-shaped matrix of random words,
// the build's knobs given by -D (FQ_WIDE, FQ_WIDE_SLICES, FQ_SWIZZLE, FQ_SLICES, FQ_STREAM,
// BLOCKS; PROBE_INT8 for x in int8, PROBE_ROWS for rows of x). Each matrix has COPIES copies laid out one after another, past the L2, and each
// launch reads the next, as a step's phases read layer after layer. Prints a JSON line a
// matrix: the median launch in microseconds and its table bytes over that time.
//   nvcc -O3 -std=c++17 -arch=sm_90 -DFQ_WIDE=2048 -I kernels/cuda bench/gpu/products_probe.cu
//   (bench/gpu/products_probe.sh builds and runs each variant)
#include <cmath>
#include <cstdint>
#include <cstring>
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
// PROBE_INT8: 0 float x (the engine's default); 1 the engine's x in int8 (FQ_INT8 set to 32:
// fq_stage_i8, then fq_dot takes fq_dot_i8); 2 that x with 32 weights a lane
// (products_int8.cuh)
#ifndef PROBE_INT8
#define PROBE_INT8 0
#endif
#if PROBE_INT8 == 1 && !defined(FQ_INT8)
#define FQ_INT8 32
#endif
#include "fused_decode.cuh"
#include "fused_step.cuh"
#include "products_int8.cuh"

#ifndef PROBE_ROWS
#define PROBE_ROWS 1  // rows of x a launch: 1 a decode step, more a verify
#endif
constexpr int THREADS = 256, G = PROBE_ROWS;
constexpr int COPIES = 8;

// y[n] = w[n] . x for rows n of matrix `mat`, R rows a warp (gate/up and q/k/v take 2), x
// staged as PROBE_INT8 says, inside the timed launch
template <int K, int R, int ROLE, int BITS>
__global__ void __launch_bounds__(THREADS, BLOCKS)
    products(FqTable t, int mat, const float* x, float* y, int N) {
  extern __shared__ __align__(16) float sm[];
  const int lane = threadIdx.x % 32;
  const int gw = blockIdx.x * (THREADS / 32) + threadIdx.x / 32, nw = gridDim.x * (THREADS / 32);
  const FqX xa = PROBE_INT8 ? fq_stage_i8<K>(x, 0, G, nullptr, sm) : fq_stage(x, G * K, sm);
  for (int n = gw * R; n < N; n += nw * R) {
    FqPart p;
    int r;
    const int fmt = t.part(mat, n, p, r);
    int rows[R];
#pragma unroll
    for (int i = 0; i < R; ++i) rows[i] = r + i;
    float acc[G][R], ss[G];
    if constexpr (PROBE_INT8 == 2) {
      i8_dot_wide<K, R, G, BITS>(p, rows, xa, acc);
    } else {
      fq_dot<K, R, G, false, false, ROLE>(fmt, p, rows, nullptr, xa, G, acc, ss);
    }
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < G; ++m) {
#pragma unroll
        for (int i = 0; i < R; ++i) y[m * N + n + i] = acc[m][i];
      }
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

template <int K, int R, int ROLE, int BITS>
void probe(const char* name, int N, int group, int sms) {
  const int bits = BITS;
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
  std::vector<float> hx(G * K);
  for (int i = 0; i < G * K; ++i) hx[i] = 0.001f * ((i * 37) % 101 - 50);
  int64_t* dmeta; uint32_t *dw, *ds, *db; float *dx, *dy;
  CHECK(cudaMalloc(&dmeta, meta.size() * 8));
  CHECK(cudaMalloc(&dw, hw.size() * 4));
  CHECK(cudaMalloc(&ds, hs.size() * 4));
  CHECK(cudaMalloc(&db, hb.size() * 4));
  CHECK(cudaMalloc(&dx, G * K * 4));
  CHECK(cudaMalloc(&dy, (size_t)G * N * 4));
  CHECK(cudaMemcpy(dmeta, meta.data(), meta.size() * 8, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dw, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(ds, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dx, hx.data(), G * K * 4, cudaMemcpyHostToDevice));
  const FqTable t{dmeta, dw, ds, db};
  const int smem = PROBE_INT8 ? G * fq_int8_row_bytes<K>() : 4 * std::min(G * K, FQ_SMEM_X);
  auto kernel = products<K, R, ROLE, BITS>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int grid = sms * BLOCKS;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> us;
  for (int i = 0; i < 20 * COPIES + 2 * COPIES; ++i) {
    CHECK(cudaEventRecord(a));
    kernel<<<grid, THREADS, smem>>>(t, i % COPIES, dx, dy, N);
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
  // the last launch read copy COPIES - 1: its first rows against float64 sums, as a
  // fraction of each row's sum of |w x|
  std::vector<float> hy(8);
  CHECK(cudaMemcpy(hy.data(), dy, 32, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int n = 0; n < 8; ++n) {
    const uint32_t* row = &hw[(COPIES - 1) * words + (size_t)n * row_words];
    double y = 0, mag = 0;
    for (int k = 0; k < K; ++k) {
      const uint64_t at = (uint64_t)k * bits, lo = row[at / 32], hi = row[at / 32 + 1];
      const unsigned q = ((lo | hi << 32) >> (at % 32)) & ((1u << bits) - 1);
      const size_t g = (COPIES - 1) * groups + (size_t)n * gpr + (k >> shift);
      float s, b;
      memcpy(&s, &hs[g], 4); memcpy(&b, &hb[g], 4);
      const double w = (double)s * q + b;
      y += w * hx[k]; mag += fabs(w * hx[k]);
    }
    worst = std::max(worst, fabs(hy[n] - y) / mag);
  }
  printf("{\"matrix\": \"%s\", \"N\": %d, \"K\": %d, \"bits\": %d, \"group\": %d, \"rows_a_warp\": %d, "
         "\"median_us\": %.2f, \"min_us\": %.2f, \"tb_s\": %.3f, \"y0\": %.6g, \"rel_err\": %.3g}\n",
         name, N, K, bits, group, R, med, us[0], bytes / med * 1e-6, hy[0], worst);
  cudaFree(dmeta); cudaFree(dw); cudaFree(ds); cudaFree(db); cudaFree(dx); cudaFree(dy);
}

int main() {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  printf("{\"build\": {\"PROBE_ROWS\": %d, \"PROBE_INT8\": %d, \"FQ_WIDE\": %d, \"FQ_WIDE_SLICES\": %d, \"FQ_SWIZZLE\": %d, "
         "\"FQ_SLICES\": %d, \"FQ_STREAM\": %d, \"BLOCKS\": %d, \"SMS\": %d}}\n",
         PROBE_ROWS, PROBE_INT8, FQ_WIDE, FQ_WIDE_SLICES, FQ_SWIZZLE, FQ_SLICES, FQ_STREAM, BLOCKS, sms);
  // Llama-3.1-8B's layer (Q4_K: 4 bits, groups of 32; Q6_K: 6 bits, groups of 16), its head
  probe<4096, 2, FQ_ROLE_QKV, 4>("8b.qkv", 6144, 32, sms);
  probe<4096, 1, FQ_ROLE_O, 4>("8b.o", 4096, 32, sms);
  probe<4096, 2, FQ_ROLE_GATE_UP, 4>("8b.gate_up", 28672, 32, sms);
  probe<14336, 1, FQ_ROLE_DOWN, 4>("8b.down.q4", 4096, 32, sms);
  probe<14336, 1, FQ_ROLE_DOWN, 6>("8b.down.q6", 4096, 16, sms);
  // Llama-3.2-1B's
  probe<2048, 2, FQ_ROLE_GATE_UP, 4>("1b.gate_up", 16384, 32, sms);
  probe<8192, 1, FQ_ROLE_DOWN, 4>("1b.down.q4", 2048, 32, sms);
  probe<2048, 2, FQ_ROLE_HEAD, 6>("1b.head.q6", 32768, 16, sms);  // a quarter of its vocabulary
  return 0;
}
