// Debug probe (bench/gpu/products_probe.cu with -DFQ_INT8=1 narrow, 2 wide): the step's dot
// products with x rounded to int8 in blocks of 32 (one float scale a block, as this engine's
// CPU path and llama.cpp's do) and multiplied by the 4- or 6-bit weights four at a time with
// dp4a, the float work once a group of weights instead of twice a weight.
//
// Each block stages x itself: K int8s, ordered within every 8 as x0 x2 x4 x6 x1 x3 x5 x7
// (a 4-bit word's low nibbles are its even weights, its high ones its odd weights), then
// a float scale a 32 and the float sum of x a group of 8 (the group's bias meets sum(x),
// unrounded). A group's sum is s * dx * sum(q xq) + b * sum(x).
//
// FQ_INT8 1: a lane's 8 weights a slice (the engine's lane map); 2: 32 a slice (16-byte
// loads of 4-bit words, three 8-byte ones of 6-bit), one float combine a group, the R
// rows' I8_WIDE_SLICES slices loaded at once.
#pragma once

// an integer below 2^22 in magnitude as a float by its exponent bits (no I2F)
__device__ __forceinline__ float i8_small_float(int d) {
  return __fsub_rn(__int_as_float(0x4B400000 + d), 12582912.0f);
}

// x [G, K] staged: row m's int8s at q + m K / 4, its scales at dx + m K / 32, its sums at
// sum8 + m K / 8
struct I8X {
  const uint32_t* q;  // K / 4 words a row: x's int8s, each 8 reordered as above
  const float* dx;    // K / 32 scales a row
  const float* sum8;  // K / 8 sums of x a row
};

template <int K, int G>
__device__ __forceinline__ I8X i8_stage(const float* x, unsigned char* sm) {
  uint32_t* q = reinterpret_cast<uint32_t*>(sm);
  float* dx = reinterpret_cast<float*>(sm + G * K);
  float* sum8 = dx + G * K / 32;
  for (int c = threadIdx.x; c < G * K / 8; c += blockDim.x) {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(x + 8 * c));
    const float4 b = __ldcg(reinterpret_cast<const float4*>(x + 8 * c) + 1);
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    float m = 0.f, s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      m = fmaxf(m, fabsf(v[i]));
      s = __fadd_rn(s, v[i]);
    }
    const unsigned int four = __activemask();  // the 4 lanes of a 32 are consecutive
    m = fmaxf(m, __shfl_xor_sync(four, m, 1));
    m = fmaxf(m, __shfl_xor_sync(four, m, 2));
    const float inv = m > 0.f ? __fdiv_rn(127.f, m) : 0.f;
    uint32_t even = 0, odd = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t e = __float2int_rn(__fmul_rn(v[2 * i], inv));
      const uint32_t o = __float2int_rn(__fmul_rn(v[2 * i + 1], inv));
      even |= (e & 255u) << (8 * i);
      odd |= (o & 255u) << (8 * i);
    }
    q[2 * c] = even;
    q[2 * c + 1] = odd;
    sum8[c] = s;
    if ((c & 3) == 0) dx[c >> 2] = __fdiv_rn(m, 127.f);
  }
  __syncthreads();
  return {q, dx, sum8};
}

// 8 weights of a 6-bit row from its 48 bits (lo: bits 0..31, hi: 32..47) as the two words
// of bytes dp4a takes: the even weights and the odd ones
__device__ __forceinline__ void i8_six(uint32_t lo, uint32_t hi, uint32_t& even, uint32_t& odd) {
  even = (lo & 0x3Fu) | ((lo >> 4) & 0x3F00u) | ((lo >> 8) & 0x3F0000u) |
         ((hi << 20) & 0x3F000000u);
  odd = ((lo >> 6) & 0x3Fu) | ((lo >> 10) & 0x3F00u) | (__funnelshift_r(lo, hi, 14) & 0x3F0000u) |
        ((hi << 14) & 0x3F000000u);
}

// narrow: slice j of a row, lane's 8 weights k = 256 j + 8 lane (4-bit only)
template <int K, int R, int G>
__device__ __forceinline__ void i8_dot_narrow(const FqPart& p, const int (&rows)[R], const I8X& x,
                                              float (&acc)[G][R]) {
  constexpr int IT = K / 256, CH = (8 / R) < IT ? 8 / R : IT;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < G; ++m) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
  }
#pragma unroll 1
  for (int c0 = 0; c0 < IT; c0 += CH) {
    uint32_t w[R][CH];
    float s[R][CH], b[R][CH];
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int k = (c0 + j) * 256 + lane * 8;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (c0 + j < IT) {
          w[r][j] = __ldg(p.w + (size_t)rows[r] * p.row_words + k / 8);
          const size_t g = (size_t)rows[r] * p.gpr + (k >> p.shift);
          s[r][j] = __uint_as_float(__ldg(p.s + g));
          b[r][j] = __uint_as_float(__ldg(p.b + g));
        }
      }
    }
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int k = (c0 + j) * 256 + lane * 8;
      if (c0 + j < IT) {
#pragma unroll
        for (int m = 0; m < G; ++m) {
          const uint2 xq = *reinterpret_cast<const uint2*>(x.q + (m * K + k) / 4);
          const float dx = x.dx[(m * K + k) >> 5], xs = x.sum8[(m * K + k) >> 3];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            int d = __dp4a(static_cast<int>(w[r][j] & 0x0F0F0F0Fu), static_cast<int>(xq.x), 0);
            d = __dp4a(static_cast<int>((w[r][j] >> 4) & 0x0F0F0F0Fu), static_cast<int>(xq.y), d);
            acc[m][r] = __fmaf_rn(__fmul_rn(s[r][j], dx), i8_small_float(d), acc[m][r]);
            acc[m][r] = __fmaf_rn(b[r][j], xs, acc[m][r]);
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

// wide: slice j of a row, lane's 32 weights k = 1024 j + 32 lane; 4-bit groups of 32 or
// 6-bit groups of 16
#ifndef I8_WIDE_SLICES
#define I8_WIDE_SLICES 2
#endif
template <int K, int R, int G, int BITS>
__device__ __forceinline__ void i8_dot_wide(const FqPart& p, const int (&rows)[R], const I8X& x,
                                            float (&acc)[G][R]) {
  constexpr int S = I8_WIDE_SLICES / R > 0 ? I8_WIDE_SLICES / R : 1;
  constexpr int IT = K / 1024, CH = S < IT ? S : IT;
  constexpr int NW = BITS;  // words a lane's 32 weights
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < G; ++m) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
  }
#pragma unroll 1
  for (int c0 = 0; c0 < IT; c0 += CH) {
    uint32_t w[R][CH][NW];
    float s[R][CH][2], b[R][CH][2];
#pragma unroll
    for (int j = 0; j < CH; ++j) {
      const int k = (c0 + j) * 1024 + lane * 32;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (c0 + j < IT) {
          const uint32_t* row = p.w + (size_t)rows[r] * p.row_words + k * BITS / 32;
          if constexpr (BITS == 4) {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(row));
            w[r][j][0] = v.x; w[r][j][1] = v.y; w[r][j][2] = v.z; w[r][j][3] = v.w;
          } else {
#pragma unroll
            for (int i = 0; i < 3; ++i) {
              const uint2 v = __ldg(reinterpret_cast<const uint2*>(row) + i);
              w[r][j][2 * i] = v.x; w[r][j][2 * i + 1] = v.y;
            }
          }
          const size_t g = (size_t)rows[r] * p.gpr + (k >> p.shift);
#pragma unroll
          for (int h = 0; h < (BITS == 4 ? 1 : 2); ++h) {
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
          const uint4 xa = *reinterpret_cast<const uint4*>(x.q + (m * K + k) / 4);
          const uint4 xb = *reinterpret_cast<const uint4*>(x.q + (m * K + k) / 4 + 4);
          const uint32_t xe[4] = {xa.x, xa.z, xb.x, xb.z}, xo[4] = {xa.y, xa.w, xb.y, xb.w};
          const float dx = x.dx[(m * K + k) >> 5];
          const float4 xs = *reinterpret_cast<const float4*>(x.sum8 + ((m * K + k) >> 3));
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if constexpr (BITS == 4) {
              int d = 0;
#pragma unroll
              for (int t = 0; t < 4; ++t) {
                const uint32_t u = w[r][j][t];
                d = __dp4a(static_cast<int>(u & 0x0F0F0F0Fu), static_cast<int>(xe[t]), d);
                d = __dp4a(static_cast<int>((u >> 4) & 0x0F0F0F0Fu), static_cast<int>(xo[t]), d);
              }
              const float sx = __fadd_rn(__fadd_rn(xs.x, xs.y), __fadd_rn(xs.z, xs.w));
              acc[m][r] = __fmaf_rn(__fmul_rn(s[r][j][0], dx), i8_small_float(d), acc[m][r]);
              acc[m][r] = __fmaf_rn(b[r][j][0], sx, acc[m][r]);
            } else {
              const uint32_t* v = w[r][j];
              const uint32_t lo[4] = {v[0], __funnelshift_r(v[1], v[2], 16), v[3],
                                      __funnelshift_r(v[4], v[5], 16)};
              const uint32_t hi[4] = {v[1], v[2] >> 16, v[4], v[5] >> 16};
              int d[2] = {0, 0};
#pragma unroll
              for (int t = 0; t < 4; ++t) {
                uint32_t e, o;
                i8_six(lo[t], hi[t] & 0xFFFFu, e, o);
                d[t / 2] = __dp4a(static_cast<int>(e), static_cast<int>(xe[t]), d[t / 2]);
                d[t / 2] = __dp4a(static_cast<int>(o), static_cast<int>(xo[t]), d[t / 2]);
              }
              const float sx[2] = {__fadd_rn(xs.x, xs.y), __fadd_rn(xs.z, xs.w)};
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                acc[m][r] = __fmaf_rn(__fmul_rn(s[r][j][h], dx), i8_small_float(d[h]), acc[m][r]);
                acc[m][r] = __fmaf_rn(b[r][j][h], sx[h], acc[m][r]);
              }
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
