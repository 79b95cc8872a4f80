"""A whole decode/verify step of a full-attention decoder as ONE CUDA kernel launch.

The five-kernels-a-layer path (`kernels.fused_decode_cuda`) is bound by MLX's per-node
host cost on CUDA (~11 us a node on the H200: ~210 nodes, ~2.4 ms a step). This kernel
runs every layer's five phases (qkv + RoPE + KV write, attention, o_proj + residual,
norm + gate/up + SiLU, down + residual) and the LM head in one launch, with a grid-wide
barrier between phases: one block per SM, all resident, phases split across blocks.

A phase is a short chain of memory latencies, so it is written for latency: a warp
issues every weight and activation load it needs before using any (`FsRows`,
`fs_dot_group`), takes the RMS norm from the activations its dot product loaded anyway,
and the next layer's weights are fetched into L2 while this one runs. Attention splits a
(row, head) over a block's warps (CK keys each, combined in shared memory) and, past
8 * CK keys, over blocks, whose partials the block that finishes last combines in chunk
order. `bench/gpu/step_probe.py` times each phase from cycle stamps the kernel writes
when built with PROF.

Every row is computed with the same instructions in the same order whatever the row
count (the attention split depends only on the row's own key count): a verify's logits
equal one-row steps bit for bit, which keeps greedy speculation exact. The five kernels
round differently; only one path is in use at a time.

Memory rules inside the launch: activations, partials and KV rows written by one block
are read by others after a barrier or a fenced counter, so those reads bypass L1
(`__ldcg`); weights are read-only. The kernel writes three inputs: the new KV rows go
straight into the state's buffers (`engine/models/fused.py` keeps each contiguous and
unshared) and the scratch buffer (activations, attention partials) is kept by
`StepKernel` between launches, every element written before it is read. A barrier that
waits too long (blocks not co-resident: a smaller GPU shared with other work) sets an
error flag instead of hanging; the caller then falls back to the five kernels.
"""

from __future__ import annotations

import hashlib
from functools import cache
from typing import Any

import mlx.core as mx

from kernels.fused_decode_cuda import _HEADER, MAX_ROWS, constants
from kernels.fused_shapes import Shapes

THREADS = 256

_STEP_HEADER = (
    _HEADER
    + r"""
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
// hang. With PROF, thread 0 of each block stores the cycles since its last release (its
// work in the phase) and block 0 the cycles between releases.
template <int PROF>
__device__ __forceinline__ void fs_grid_sync(
    unsigned int* flags, unsigned int epoch, unsigned int* stamps, long long& t_rel) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (PROF)
      stamps[(epoch - 1) * (gridDim.x + 1) + 1 + blockIdx.x] = (unsigned int)(clock64() - t_rel);
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
  if (PROF) {
    const long long now = clock64();
    if (blockIdx.x == 0 && threadIdx.x == 0)
      stamps[(epoch - 1) * (gridDim.x + 1)] = (unsigned int)(now - t_rel);
    t_rel = now;
  }
}
"""
)

_BODY = r"""
  // Host-written inputs (ids, pos) are read once per block; every buffer the blocks
  // share (scratch, sync) is a large allocation of its own: MLX's small buffers share
  // managed-memory pages with host-touched arrays, and GPU atomics or reads on such a
  // page cross the bus (a 150-barrier step went from 0.4 ms to 77 ms).
  const int M = ids_shape[0];
  const int cap = k0_shape[1];
  __shared__ int s_ids[FD_MAXM];
  __shared__ int s_p0;
  if (threadIdx.x < M) s_ids[threadIdx.x] = ids[threadIdx.x];
  if (threadIdx.x == 0) s_p0 = pos[0];
  __syncthreads();
  const int p0 = s_p0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gw = blockIdx.x * FD_WARPS + warp, nw = gridDim.x * FD_WARPS;
  const float NEG_INF = __int_as_float(0xff800000);
  unsigned int* sync = sync_buf;
  unsigned int* counters = sync_buf + 4096;  // attention chunks done, a (row, head)
  unsigned int phase = 0;
  long long t_rel = clock64();
  const long long t_start = t_rel;
  unsigned long long gt_start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt_start));
  constexpr int PAIRS = (H + 2 * HKV) * DH / 2;  // of q/k/v outputs (fd_qkv_pair)
  constexpr int NQKV = (H + 2 * HKV) * DH;
  constexpr int HD = H * DH;
  constexpr int GD = fs_group(D);
  // attention: a warp takes CK keys of one (row, head); LPK lanes share a key (8 dims
  // each), KPI keys a load; a lane owns VD dims of the output (lanes past VOWN mirror)
  constexpr int LPK = DH / 8, KPI = 32 / LPK, KIT = CK / KPI;
  constexpr int VD = DH >= 32 ? DH / 32 : 1, VOWN = DH / VD;
  static_assert(32 % LPK == 0 && CK % KPI == 0 && CK <= 64, "attention split");
  static_assert(4096 + FD_MAXM * H <= 16384, "attention counters fit the sync buffer");
  float* work = const_cast<float*>(scratch);
  float* qs = work;
  float* ao = qs + FD_MAXM * HD;
  float* hs = ao + FD_MAXM * HD;
  float* act = hs + FD_MAXM * D;
  float* xs = act + FD_MAXM * F;
  float* part = xs + FD_MAXM * D;  // attention partials [row, head, chunk] x (max, sum, DH)
  // embedding rows, as float32, into xs
  for (int i = (blockIdx.x * blockDim.x + threadIdx.x); i < M * D; i += gridDim.x * blockDim.x) {
    const int m = i / D, k = i % D;
    xs[i] = static_cast<float>(table[(size_t)s_ids[m] * D + k]);
  }
  fs_grid_sync<PROF>(sync, ++phase, stamps, t_rel);
  const float* x = xs;
  for (int l = 0; l < L; ++l) {
    T* kc = const_cast<T*>(KEYS[l]);
    T* vc = const_cast<T*>(VALUES[l]);
    if (PREFETCH && l + 1 < L) {  // the next layer's weights into L2 while this one runs
      fs_prefetch_l2(wqkv + (size_t)(l + 1) * NQKV * D, (size_t)NQKV * D * sizeof(T));
      fs_prefetch_l2(wo + (size_t)(l + 1) * D * HD, (size_t)D * HD * sizeof(T));
      fs_prefetch_l2(wgu + (size_t)(l + 1) * 2 * F * D, (size_t)2 * F * D * sizeof(T));
      fs_prefetch_l2(wdown + (size_t)(l + 1) * D * F, (size_t)D * F * sizeof(T));
    }
    // -- A: norm + qkv + rope; q to qs, k / v rows into the cache at pos + m
    for (int p = gw; p < PAIRS; p += nw) {
      int n0, n1, fi;
      fd_qkv_pair<H, HKV, DH, TRADITIONAL>(p, n0, n1, fi);
      const T* w = wqkv + (size_t)l * NQKV * D;
      const T* src[2] = {w + (size_t)n0 * D, w + (size_t)n1 * D};
      FsRows<T, D, 2> rows;
      rows.load(src);
      FsScale<D> sc;
      sc.load(nw1 + l * D);
      const int head = n0 / DH;
      const int d0 = n0 % DH, d1 = n1 % DH;
      const float inv_freq = fi >= 0 ? exp2f(-(2.0f * fi / DH) * LOG2_BASE) : 0.f;
      for (int m0 = 0; m0 < M; m0 += GD) {
        float acc[GD][2], ss[GD];
        fs_dot_group<T, D, 2, GD, true, true>(rows, sc, x, m0, M, acc, ss);
#pragma unroll
        for (int g = 0; g < GD; ++g) {
          const int m = m0 + g;
          if (m < M && lane == 0) {
            const float rinv = 1.0f / sqrtf(ss[g] / D + EPS);
            float s0 = acc[g][0] * rinv, s1 = acc[g][1] * rinv;
            if (fi >= 0) {
              float sn, cs;
              sincosf(static_cast<float>(p0 + m) * inv_freq, &sn, &cs);
              const float r0 = s0 * cs - s1 * sn;
              s1 = s0 * sn + s1 * cs;
              s0 = r0;
            }
            if (head < H) {
              qs[m * HD + n0] = s0;
              qs[m * HD + n1] = s1;
            } else if (head < H + HKV) {
              const size_t base = ((size_t)(head - H) * cap + p0 + m) * DH;
              kc[base + d0] = static_cast<T>(s0);
              kc[base + d1] = static_cast<T>(s1);
            } else {
              const size_t base = ((size_t)(head - H - HKV) * cap + p0 + m) * DH;
              vc[base + d0] = static_cast<T>(s0);
              vc[base + d1] = static_cast<T>(s1);
            }
          }
        }
      }
    }
    fs_grid_sync<PROF>(sync, ++phase, stamps, t_rel);
    // -- B: attention. A block takes (row m, head h, block chunk c): keys c * BK .. of row
    // m's n = p0 + m + 1, CK of them a warp (scores, the warp's max and sum, its weighted
    // values), combined in shared memory in warp order. A row of one block chunk is done;
    // otherwise the block that completes a (row, head) combines its chunks in chunk order
    // (which block finishes last changes nothing in the arithmetic).
    {
      constexpr int BK = FD_WARPS * CK;
      const int C = (p0 + M + BK - 1) / BK;  // block chunks of the last row
      const int CMAX = (cap + BK - 1) / BK;
      const int sub = lane / LPK, part8 = lane % LPK;
      const int vdim = (lane % VOWN) * VD;
      const float qscale = rsqrtf(static_cast<float>(DH));
      __shared__ float s_m[FD_WARPS], s_l[FD_WARPS], s_acc[FD_WARPS][DH];
      __shared__ unsigned int s_last;
      for (int item = blockIdx.x; item < M * H * C; item += gridDim.x) {
        const int c = item % C, mh = item / C, h = mh % H, m = mh / H;
        const int n = p0 + m + 1, nc = (n + BK - 1) / BK;
        if (c >= nc) continue;  // the same for the whole block
        const int j0 = c * BK + warp * CK;
        float cmax = NEG_INF, lsum = 0.f, acc[VD];
#pragma unroll
        for (int d = 0; d < VD; ++d) acc[d] = 0.f;
        if (j0 < n) {
          const int kvh = h / (H / HKV);
          const T* kb = kc + (size_t)kvh * cap * DH;
          const T* vb = vc + (size_t)kvh * cap * DH;
          FsRaw<8 * sizeof(T)> kr[KIT];
          FsRaw<VD * sizeof(T)> vr[CK];
#pragma unroll
          for (int it = 0; it < KIT; ++it) {
            const int j = min(j0 + it * KPI + sub, n - 1);
            kr[it].load_cg(kb + (size_t)j * DH + part8 * 8);
          }
#pragma unroll
          for (int i = 0; i < CK; ++i)
            vr[i].load_cg(vb + (size_t)min(j0 + i, n - 1) * DH + vdim);
          float q[8];
          fs_load8_cg(qs + (size_t)m * HD + h * DH + part8 * 8, q);
          float sc[KIT];
#pragma unroll
          for (int it = 0; it < KIT; ++it) {
            float kv[8];
            fs_unpack<T, 8>(kr[it], kv);
            float d = 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) d += (q[i] * qscale) * kv[i];
#pragma unroll
            for (int o = LPK / 2; o > 0; o >>= 1) d += __shfl_xor_sync(FD_FULL, d, o);
            sc[it] = j0 + it * KPI + sub < n ? d : NEG_INF;
            cmax = fmaxf(cmax, sc[it]);
          }
#pragma unroll
          for (int o = LPK; o < 32; o <<= 1) cmax = fmaxf(cmax, __shfl_xor_sync(FD_FULL, cmax, o));
          float pr[KIT];
#pragma unroll
          for (int it = 0; it < KIT; ++it) {
            pr[it] = sc[it] == NEG_INF ? 0.f : expf(sc[it] - cmax);
            lsum += pr[it];
          }
#pragma unroll
          for (int o = LPK; o < 32; o <<= 1) lsum += __shfl_xor_sync(FD_FULL, lsum, o);
#pragma unroll
          for (int i = 0; i < CK; ++i) {
            const float pi = __shfl_sync(FD_FULL, pr[i / KPI], (i % KPI) * LPK);
            float vv[VD];
            fs_unpack<T, VD>(vr[i], vv);
#pragma unroll
            for (int d = 0; d < VD; ++d) acc[d] += pi * vv[d];
          }
        }
        if (lane == 0) { s_m[warp] = cmax; s_l[warp] = lsum; }
        if (lane < VOWN) {
#pragma unroll
          for (int d = 0; d < VD; ++d) s_acc[warp][vdim + d] = acc[d];
        }
        __syncthreads();
        float* out = ao + (size_t)m * HD + h * DH;
        float* slots = part + (size_t)mh * CMAX * (DH + 2);  // [chunk] x (max, sum, DH)
        if (threadIdx.x < DH) {  // thread d: output dim d over the block's warps
          const int d = threadIdx.x;
          float gm = NEG_INF;
#pragma unroll
          for (int w = 0; w < FD_WARPS; ++w) gm = fmaxf(gm, s_m[w]);
          float gl = 0.f, go = 0.f;
#pragma unroll
          for (int w = 0; w < FD_WARPS; ++w) {
            const float e = s_m[w] == NEG_INF ? 0.f : expf(s_m[w] - gm);
            gl += s_l[w] * e;
            go += s_acc[w][d] * e;
          }
          if (nc == 1) {
            out[d] = go / gl;
          } else {
            float* mine = slots + (size_t)c * (DH + 2);
            if (d == 0) { mine[0] = gm; mine[1] = gl; }
            mine[2 + d] = go;
            __threadfence();
          }
        }
        if (nc > 1) {
          __syncthreads();
          if (threadIdx.x == 0) s_last = atomicAdd(counters + mh, 1u) == (unsigned int)nc - 1;
          __syncthreads();
          if (s_last && threadIdx.x < DH) {  // every chunk of (m, h) is in: combine in order
            __threadfence();
            const int d = threadIdx.x;
            float gm = NEG_INF;
            for (int cc = 0; cc < nc; ++cc) gm = fmaxf(gm, __ldcg(slots + (size_t)cc * (DH + 2)));
            float gl = 0.f, go = 0.f;
            for (int cc = 0; cc < nc; ++cc) {
              const float* sl = slots + (size_t)cc * (DH + 2);
              const float e = expf(__ldcg(sl) - gm);
              gl += __ldcg(sl + 1) * e;
              go += __ldcg(sl + 2 + d) * e;
            }
            out[d] = go / gl;
            if (d == 0) counters[mh] = 0;  // for the next layer, past a grid barrier
          }
        }
        __syncthreads();  // shared memory is free for the next item
      }
    }
    fs_grid_sync<PROF>(sync, ++phase, stamps, t_rel);
    // -- C: o_proj + residual -> hs
    fs_residual_phase<T, HD, D>(ao, wo + (size_t)l * D * HD, x, hs, M, gw, nw);
    fs_grid_sync<PROF>(sync, ++phase, stamps, t_rel);
    // -- D: norm + gate/up + SiLU(gate) * up -> act; a warp takes outputs n, n + 1
    for (int item = gw; item < F / 2; item += nw) {
      const int n = 2 * item;
      const T* w = wgu + (size_t)l * 2 * F * D;
      const T* src[4] = {w + (size_t)n * D, w + (size_t)(F + n) * D, w + (size_t)(n + 1) * D,
                         w + (size_t)(F + n + 1) * D};
      FsRows<T, D, 4> rows;
      rows.load(src);
      FsScale<D> sc;
      sc.load(nw2 + l * D);
      for (int m0 = 0; m0 < M; m0 += GD) {
        float acc[GD][4], ss[GD];
        fs_dot_group<T, D, 4, GD, true, true>(rows, sc, hs, m0, M, acc, ss);
#pragma unroll
        for (int g = 0; g < GD; ++g) {
          const int m = m0 + g;
          if (m < M && lane == 0) {
            const float rinv = 1.0f / sqrtf(ss[g] / D + EPS);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const float gs = acc[g][2 * j] * rinv, us = acc[g][2 * j + 1] * rinv;
              act[(size_t)m * F + n + j] = gs / (1.0f + expf(-gs)) * us;
            }
          }
        }
      }
    }
    fs_grid_sync<PROF>(sync, ++phase, stamps, t_rel);
    // -- E: down + residual -> xs
    fs_residual_phase<T, F, D>(act, wdown + (size_t)l * D * F, hs, xs, M, gw, nw);
    fs_grid_sync<PROF>(sync, ++phase, stamps, t_rel);
    x = xs;
  }
  // -- head: final norm + LM head for rows [r0, M); eight outputs a warp, the next eight
  // rows fetched into L2 while these are summed
  if (HEAD_MODE != 0) {
    const int r0 = HEAD_MODE == 1 ? M - 1 : 0;
    const int rows_n = M - r0;
    constexpr int GH = 1;  // a row at a time: eight outputs take the registers
    constexpr int RH = 8;
    constexpr int ITEMS = (V + RH - 1) / RH;
    FsScale<D> sc;
    sc.load(nwf);
    for (int item = gw; item < ITEMS; item += nw) {
      const T* src[RH];
#pragma unroll
      for (int j = 0; j < RH; ++j) src[j] = whead + (size_t)min(RH * item + j, V - 1) * D;
      FsRows<T, D, RH> rows;
      rows.load(src);
      if (item + nw < ITEMS) {
        const int first = RH * (item + nw), count = min(RH, V - first);
        const char* next = reinterpret_cast<const char*>(whead + (size_t)first * D);
        for (int off = lane * 128; off < count * D * (int)sizeof(T); off += 32 * 128)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(next + off));
      }
      for (int m0 = 0; m0 < rows_n; m0 += GH) {
        float acc[GH][RH], ss[GH];
        fs_dot_group<T, D, RH, GH, true, true>(rows, sc, xs + (size_t)r0 * D, m0, rows_n, acc, ss);
#pragma unroll
        for (int g = 0; g < GH; ++g) {
          if (m0 + g < rows_n && lane == 0) {
            const float rinv = 1.0f / sqrtf(ss[g] / D + EPS);
#pragma unroll
            for (int j = 0; j < RH; ++j)
              if (RH * item + j < V)
                logits[(size_t)(m0 + g) * V + RH * item + j] = acc[g][j] * rinv;
          }
        }
      }
    }
  }
  if (PROF) {
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned int slots = 5 * L + 2, row = gridDim.x + 1;
      stamps[(slots - 1) * row + 1 + blockIdx.x] = (unsigned int)(clock64() - t_rel);
      if (blockIdx.x == 0) {
        unsigned long long gt_end;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt_end));
        stamps[slots * row] = (unsigned int)(gt_end - gt_start);
        stamps[slots * row + 1] = (unsigned int)(clock64() - t_start);
      }
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) status[0] = sync[1];
"""

_SM_COUNT = r"""
  if (threadIdx.x == 0) {
    unsigned int n;
    asm volatile("mov.u32 %0, %%nsmid;" : "=r"(n));
    out[0] = static_cast<int>(n);
  }
"""

_WEIGHTS = ["nw1", "wqkv", "wo", "nw2", "wgu", "wdown", "nwf", "whead"]


def step_source(shapes: Shapes, num_layers: int) -> str:
    lines = [constants(shapes, L=num_layers, THREADS=THREADS)]
    keys = ", ".join(f"k{i}" for i in range(num_layers))
    values = ", ".join(f"v{i}" for i in range(num_layers))
    lines.append(f"  const T* KEYS[L] = {{{keys}}};")
    lines.append(f"  const T* VALUES[L] = {{{values}}};")
    return "\n".join(lines) + "\n" + _BODY


def input_names(num_layers: int) -> list[str]:
    caches = [f"k{i}" for i in range(num_layers)] + [f"v{i}" for i in range(num_layers)]
    return ["ids", "pos", "table", "scratch", *_WEIGHTS, *caches]


def output_names() -> list[str]:
    return ["logits", "sync_buf", "status", "stamps"]


def chunk_keys(head_dim: int, itemsize: int) -> int:
    """Keys one warp's attention item takes: as many as keep its K and V loads within
    ~64 registers each (64 for head_dim 64 in bfloat16)."""
    lanes_per_key = head_dim // 8
    keys_per_load = 32 // lanes_per_key
    value_dims = max(1, head_dim // 32)
    value_regs = max(1, value_dims * itemsize // 4)
    return min(256 // (8 * itemsize) * keys_per_load, 64 // value_regs)


def scratch_size(shapes: Shapes, capacity: int, itemsize: int) -> int:
    """float32 elements of the step's scratch: activations, then attention partials."""
    s = shapes
    HD = s.heads * s.head_dim
    chunks = -(-capacity // (8 * chunk_keys(s.head_dim, itemsize)))  # a block's 8 warps
    activations = MAX_ROWS * (2 * HD + 2 * s.hidden + s.intermediate)
    partials = MAX_ROWS * s.heads * chunks * (s.head_dim + 2)
    return max(activations + partials, _PRIVATE_PAGE_FLOATS)


_PRIVATE_PAGE_FLOATS = 1 << 14  # 64 KiB: large enough for an allocation of its own


@cache
def sm_count() -> int:
    """Streaming multiprocessors on the current GPU (read from %nsmid in a kernel)."""
    kernel: Any = mx.fast.cuda_kernel(
        name="fs_sm_count", input_names=["dummy"], output_names=["out"], source=_SM_COUNT
    )
    (out,) = kernel(
        inputs=[mx.zeros((1,), dtype=mx.int32)],
        grid=(32, 1, 1),
        threadgroup=(32, 1, 1),
        output_shapes=[(1,)],
        output_dtypes=[mx.int32],
    )
    return int(out.item())


class StepKernel:
    """One launch per step for a model of `num_layers` layers with these shapes."""

    def __init__(self, shapes: Shapes, num_layers: int, prefetch: bool = True) -> None:
        reason = shapes.check() or step_unsupported(shapes)
        if reason:
            raise ValueError(f"fused step kernel: unsupported {reason}")
        self.s, self.L = shapes, num_layers
        self.prefetch = prefetch
        tag = hashlib.sha1(f"{shapes!r}/{num_layers}".encode()).hexdigest()[:10]
        self.blocks = sm_count()
        self._scratch: mx.array | None = None
        self._kernel: Any = mx.fast.cuda_kernel(
            name=f"fs_step_{tag}",
            input_names=input_names(num_layers),
            output_names=output_names(),
            source=step_source(shapes, num_layers),
            header=_STEP_HEADER,
        )

    def scratch(self, capacity: int, dtype: mx.Dtype) -> mx.array:
        """The step's scratch buffer (kept: the kernel writes every element it reads)."""
        need = scratch_size(self.s, capacity, dtype.size)
        if self._scratch is None or self._scratch.size < need:
            self._scratch = mx.zeros((need,), dtype=mx.float32)
            mx.eval(self._scratch)
        return self._scratch

    def __call__(
        self,
        ids: mx.array,
        pos: mx.array,
        table: mx.array,
        weights: list[mx.array],
        keys: list[mx.array],
        values: list[mx.array],
        head_mode: int,
        profile: bool = False,
        prefetch: bool | None = None,
    ) -> tuple[mx.array, ...]:
        """(logits [rows, V] f32, status [1] u32: nonzero if a barrier timed out), and with
        `profile` the kernel's cycle stamps (bench/gpu/step_probe.py reads them).
        head_mode: 0 no logits, 1 the last row's, 2 every row's."""
        s = self.s
        M = ids.shape[0]
        if not 1 <= M <= MAX_ROWS:
            raise ValueError(f"a fused step takes 1..{MAX_ROWS} rows, not {M}")
        rows = {0: 1, 1: 1, 2: M}[head_mode]
        dtype = weights[1].dtype
        scratch = self.scratch(keys[0].shape[1], dtype)
        stamps = (5 * self.L + 2) * (self.blocks + 1) + 2 if profile else 1
        outs = self._kernel(
            inputs=[ids, pos, table, scratch, *weights, *keys, *values],
            template=[
                ("T", dtype),
                ("HEAD_MODE", head_mode),
                ("CK", chunk_keys(s.head_dim, dtype.size)),
                ("PREFETCH", int(self.prefetch if prefetch is None else prefetch)),
                ("PROF", int(profile)),
            ],
            grid=(self.blocks * THREADS, 1, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(rows, s.vocab), (_PRIVATE_PAGE_FLOATS,), (1,), (stamps,)],
            output_dtypes=[mx.float32, mx.uint32, mx.uint32, mx.uint32],
            init_value=0,
        )
        return (outs[0], outs[2], outs[3]) if profile else (outs[0], outs[2])


def step_unsupported(shapes: Shapes) -> str | None:
    """Why the one-launch kernel can't take these shapes (the five kernels may), or None."""
    if shapes.head_dim not in (8, 16, 32, 64, 128, 256):
        return f"head_dim {shapes.head_dim} (the one-launch attention needs a power of two)"
    return None
