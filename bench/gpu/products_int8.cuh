// Debug probe (bench/gpu/products_probe.cu with -DPROBE_INT8=2): the step's dot products with
// x in int8 as the engine stages it (fused_step.cuh's fq_stage_i8: blocks of 32, each 8 as
// x0 x2 x4 x6 x1 x3 x5 x7, a scale a block) and 32 weights a lane where fq_dot_i8 takes 8:
// one 16-byte load of 4-bit words (three 8-byte ones of 6-bit), a group's float work once a
// lane, the R rows' I8_WIDE_SLICES slices loaded at once. A group's sum is s * d * sum(q xq)
// + b * d * sum(xq), as fq_dot_i8's.
#pragma once

#ifndef I8_WIDE_SLICES
#define I8_WIDE_SLICES 2
#endif

// slice j of a row, a lane's 32 weights k = 1024 j + 32 lane: 4-bit groups of 32 or 6-bit
// groups of 16 (affine, float32 s and b), against G rows of x
template <int K, int R, int G, int BITS>
__device__ __forceinline__ void i8_dot_wide(const FqPart& p, const int (&rows)[R], const FqX& x,
                                            float (&acc)[G][R]) {
  constexpr int S = I8_WIDE_SLICES / R > 0 ? I8_WIDE_SLICES / R : 1;
  constexpr int IT = K / 1024, CH = S < IT ? S : IT;
  constexpr int NW = BITS, HALVES = BITS == 4 ? 1 : 2;  // words a lane's 32; groups in them
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < G; ++m) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
  }
#pragma unroll 1
  for (int c0 = 0; c0 < IT; c0 += CH) {
    uint32_t w[R][CH][NW];
    float s[R][CH][HALVES], b[R][CH][HALVES];
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int k = (c0 + j) * 1024 + lane * 32;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (c0 + j < IT) {
          const uint32_t* row = p.w + (size_t)rows[r] * p.row_words + k * BITS / 32;
          if constexpr (BITS == 4) {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(row));
            w[r][j][0] = v.x, w[r][j][1] = v.y, w[r][j][2] = v.z, w[r][j][3] = v.w;
          } else {
#pragma unroll
            for (int i = 0; i < 3; ++i) {
              const uint2 v = __ldg(reinterpret_cast<const uint2*>(row) + i);
              w[r][j][2 * i] = v.x, w[r][j][2 * i + 1] = v.y;
            }
          }
          const size_t g = (size_t)rows[r] * p.gpr + (k >> p.shift);
#pragma unroll
          for (int h = 0; h < HALVES; ++h) {
            s[r][j][h] = __uint_as_float(__ldg(p.s + g + h));
            b[r][j][h] = __uint_as_float(__ldg(p.b + g + h));
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int k = (c0 + j) * 1024 + lane * 32;
      if (c0 + j < IT) {
#pragma unroll
        for (int m = 0; m < G; ++m) {
          const uint4 xa = *reinterpret_cast<const uint4*>(x.q8 + (m * K + k) / 4);
          const uint4 xc = *reinterpret_cast<const uint4*>(x.q8 + (m * K + k) / 4 + 4);
          const uint32_t xe[4] = {xa.x, xa.z, xc.x, xc.z}, xo[4] = {xa.y, xa.w, xc.y, xc.w};
          const float dx = x.d8[(m * K + k) / 32];
          float xb[HALVES];  // d * sum(xq) over each group
#pragma unroll
          for (int h = 0; h < HALVES; ++h) {
            int sum = 0;
#pragma unroll
            for (int t = h * 4 / HALVES; t < (h + 1) * 4 / HALVES; ++t) {
              sum = __dp4a(static_cast<int>(xe[t]), 0x01010101, sum);
              sum = __dp4a(static_cast<int>(xo[t]), 0x01010101, sum);
            }
            xb[h] = __fmul_rn(dx, fq_int_float(sum));
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            int d[HALVES] = {};
#pragma unroll
            for (int t = 0; t < 4; ++t) {
              uint32_t e, o;
              if constexpr (BITS == 4) {
                e = w[r][j][t] & 0x0F0F0F0Fu;
                o = (w[r][j][t] >> 4) & 0x0F0F0F0Fu;
              } else {  // 48 bits a t: words 0-1, 1-2 (from bit 16), 3-4, 4-5 (from bit 16)
                const uint32_t* v = w[r][j];
                const uint32_t lo = t == 0 ? v[0] : t == 1 ? __funnelshift_r(v[1], v[2], 16)
                                  : t == 2 ? v[3] : __funnelshift_r(v[4], v[5], 16);
                const uint32_t hi =
                    t == 0 ? v[1] : t == 1 ? v[2] >> 16 : t == 2 ? v[4] : v[5] >> 16;
                fq_six_bytes(lo, hi, e, o);
              }
              const int h = t * HALVES / 4;
              d[h] = __dp4a(static_cast<int>(e), static_cast<int>(xe[t]), d[h]);
              d[h] = __dp4a(static_cast<int>(o), static_cast<int>(xo[t]), d[h]);
            }
#pragma unroll
            for (int h = 0; h < HALVES; ++h) {
              acc[m][r] = __fmaf_rn(__fmul_rn(s[r][j][h], dx), fq_int_float(d[h]), acc[m][r]);
              acc[m][r] = __fmaf_rn(b[r][j][h], xb[h], acc[m][r]);
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < G; ++m) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = fd_warp_sum(acc[m][r]);
  }
}
