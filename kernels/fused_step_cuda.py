"""A whole decode/verify step of a full-attention decoder as ONE CUDA kernel launch.

The five-kernels-a-layer path (`kernels.fused_decode_cuda`) is bound by MLX's per-node
host cost on CUDA (~11 us a node on the H200: ~210 nodes, ~2.4 ms a step). This kernel
runs every layer's five phases (qkv + RoPE + KV write, attention, o_proj + residual,
norm + gate/up + SiLU, down + residual) and the LM head in one launch, with a grid-wide
barrier between phases: one block per SM, all resident, phases split across blocks.

Each phase follows the five kernels' arithmetic (their bodies are written out again here,
with loads unrolled over K and read past L1), and like them computes every row with the
same instructions in the same order whatever the row count: a verify's logits equal
one-row steps bit for bit, which keeps greedy speculation exact. The two paths round
differently from each other; only one is in use at a time.

Memory rules inside the launch: activations and KV rows written by one block are read
by others after a barrier, so those reads bypass L1 (`__ldcg`); weights are read-only.
The new KV rows go straight into the state's buffers (the only writes to an input;
`engine/models/fused.py` guarantees each buffer is contiguous and unshared). A barrier
that waits too long (blocks not co-resident: a smaller GPU shared with other work) sets
an error flag instead of hanging; the caller then falls back to the five kernels.
"""

from __future__ import annotations

import hashlib
import math
from functools import cache
from typing import Any

import mlx.core as mx

from kernels.fused_decode_cuda import _HEADER, MAX_ROWS, Shapes

THREADS = 256

_STEP_HEADER = (
    _HEADER
    + r"""
__device__ __forceinline__ void fs_load8_cg(const float* p, float* out) {
  const float4 a = __ldcg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldcg(reinterpret_cast<const float4*>(p + 4));
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

template <typename W>
__device__ __forceinline__ void fs_load8_cg(const W* p, float* out) {
  const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(p));
  const W* v = reinterpret_cast<const W*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = static_cast<float>(v[i]);
}

// acc0[m] += x[m] . (scale * w0), acc1[m] += x[m] . (scale * w1) for this lane's k, with the
// activation rows read past L1 (other blocks wrote them). Unrolled over K so every load of
// a lane is in flight at once; the order of the sums does not depend on M.
template <typename W, int K, bool SCALED, bool TWO>
__device__ __forceinline__ void fs_dot_rows2(
    const float* x, int M, const float* scale, const W* w0, const W* w1,
    float* acc0, float* acc1) {
  const int lane = threadIdx.x % 32;
  constexpr int ITERS = (K + 255) / 256;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int k = it * 256 + lane * 8;
    if (k < K) {
      float wa[8], wb[8];
      fd_load8(w0 + k, wa);
      if (TWO) fd_load8(w1 + k, wb);
      if (SCALED) {
        float sv[8];
        fd_load8(scale + k, sv);
#pragma unroll
        for (int i = 0; i < 8; ++i) { wa[i] *= sv[i]; if (TWO) wb[i] *= sv[i]; }
      }
#pragma unroll
      for (int m = 0; m < FD_MAXM; ++m) {
        if (m < M) {
          float xv[8];
          fs_load8_cg(x + m * K + k, xv);
          float s0 = 0.f, s1 = 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) { s0 += xv[i] * wa[i]; if (TWO) s1 += xv[i] * wb[i]; }
          acc0[m] += s0;
          if (TWO) acc1[m] += s1;
        }
      }
    }
  }
}

template <typename W, int K, bool SCALED>
__device__ __forceinline__ void fs_dot_rows(
    const float* x, int M, const float* scale, const W* w, float* acc) {
  fs_dot_rows2<W, K, SCALED, false>(x, M, scale, w, w, acc, acc);
}

template <int K>
__device__ __forceinline__ void fs_row_rinv(const float* x, int M, float eps, float* rinv) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int ITERS = (K / 4 + 31) / 32;
  for (int m = warp; m < M; m += FD_WARPS) {
    float s = 0.f;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int k4 = it * 32 + lane;
      if (k4 < K / 4) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(x + m * K) + k4);
        s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
    }
    s = fd_warp_sum(s);
    if (lane == 0) rinv[m] = 1.0f / sqrtf(s / K + eps);
  }
  __syncthreads();
}

// Grid-wide barrier on a monotonically increasing counter; flags[1] records a timeout.
__device__ __forceinline__ void fs_grid_sync(unsigned int* flags, unsigned int target) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(flags, 1u);
    const long long start = clock64();
    while (*reinterpret_cast<volatile unsigned int*>(flags) < target) {
      if (*reinterpret_cast<volatile unsigned int*>(flags + 1)) break;
      if (clock64() - start > (1ll << 32)) { atomicExch(flags + 1, 1u); break; }
    }
    __threadfence();
  }
  __syncthreads();
}
"""
)

_BODY = r"""
  // Host-written inputs (ids, pos) are read once per block; every buffer the blocks
  // share (work, sync) is a large allocation of its own: MLX's small buffers share
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
  __shared__ float rinv[FD_MAXM];
  __shared__ float s_m[FD_WARPS], s_l[FD_WARPS], s_acc[FD_WARPS][DH];
  unsigned int* sync = sync_buf;
  unsigned int phase = 0;
  constexpr int HALF = DH / 2;
  constexpr int ROPED_PAIRS = (H + HKV) * HALF;
  constexpr int PAIRS = ROPED_PAIRS + HKV * HALF;
  constexpr int NQKV = (H + 2 * HKV) * DH;
  constexpr int HD = H * DH;
  float* qs = work;
  float* ao = qs + FD_MAXM * HD;
  float* hs = ao + FD_MAXM * HD;
  float* act = hs + FD_MAXM * D;
  float* xs = act + FD_MAXM * F;
  // embedding rows, as float32, into xs
  for (int i = (blockIdx.x * blockDim.x + threadIdx.x); i < M * D; i += gridDim.x * blockDim.x) {
    const int m = i / D, k = i % D;
    xs[i] = static_cast<float>(table[(size_t)s_ids[m] * D + k]);
  }
  fs_grid_sync(sync, ++phase * gridDim.x);
  const float* x = xs;
  for (int l = 0; l < L; ++l) {
    T* kc = const_cast<T*>(KEYS[l]) ;
    T* vc = const_cast<T*>(VALUES[l]);
    // -- A: norm + qkv + rope; q to qs, k / v rows into the cache at pos + m
    fs_row_rinv<D>(x, M, EPS, rinv);
    for (int p = gw; p < PAIRS; p += nw) {
      int n0, n1, fi = -1;
      if (p < ROPED_PAIRS) {
        const int head = p / HALF, i = p % HALF;
        n0 = head * DH + (TRADITIONAL ? 2 * i : i);
        n1 = n0 + (TRADITIONAL ? 1 : HALF);
        fi = i;
      } else {
        n0 = (H + HKV) * DH + 2 * (p - ROPED_PAIRS);
        n1 = n0 + 1;
      }
      float a0[FD_MAXM], a1[FD_MAXM];
#pragma unroll
      for (int m = 0; m < FD_MAXM; ++m) { a0[m] = 0.f; a1[m] = 0.f; }
      const T* w = wqkv + (size_t)l * NQKV * D;
      fs_dot_rows2<T, D, true, true>(
          x, M, nw1 + l * D, w + (size_t)n0 * D, w + (size_t)n1 * D, a0, a1);
      const int head = n0 / DH;
      const int d0 = n0 % DH, d1 = n1 % DH;
      const float inv_freq = fi >= 0 ? exp2f(-(2.0f * fi / DH) * LOG2_BASE) : 0.f;
#pragma unroll
      for (int m = 0; m < FD_MAXM; ++m) {
        if (m < M) {
          float s0 = fd_warp_sum(a0[m]) * rinv[m];
          float s1 = fd_warp_sum(a1[m]) * rinv[m];
          if (lane == 0) {
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
    fs_grid_sync(sync, ++phase * gridDim.x);
    // -- B: attention, one block per (head, row)
    for (int item = blockIdx.x; item < H * M; item += gridDim.x) {
      const int h = item % H, m = item / H;
      const int n = p0 + m + 1;
      const int kvh = h / (H / HKV);
      float qv[DH], acc[DH];
      const float scale = rsqrtf(static_cast<float>(DH));
#pragma unroll
      for (int d = 0; d < DH; ++d) {
        qv[d] = __ldcg(qs + (size_t)m * HD + h * DH + d) * scale;
        acc[d] = 0.f;
      }
      float mx = NEG_INF, lsum = 0.f;
      const T* kb = kc + (size_t)kvh * cap * DH;
      const T* vb = vc + (size_t)kvh * cap * DH;
      for (int j = threadIdx.x; j < n; j += THREADS) {
        float s = 0.f;
#pragma unroll
        for (int d = 0; d < DH; d += 8) {
          float kv[8];
          fs_load8_cg(kb + (size_t)j * DH + d, kv);
#pragma unroll
          for (int i = 0; i < 8; ++i) s += qv[d + i] * kv[i];
        }
        float c = 1.f, e = 1.f;
        if (s > mx) { c = expf(mx - s); mx = s; } else { e = expf(s - mx); }
        lsum = lsum * c + e;
#pragma unroll
        for (int d = 0; d < DH; d += 8) {
          float vv[8];
          fs_load8_cg(vb + (size_t)j * DH + d, vv);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[d + i] = acc[d + i] * c + e * vv[i];
        }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const float omx = __shfl_xor_sync(FD_FULL, mx, off);
        const float ol = __shfl_xor_sync(FD_FULL, lsum, off);
        const float nm = fmaxf(mx, omx);
        const float c1 = mx == NEG_INF ? 0.f : expf(mx - nm);
        const float c2 = omx == NEG_INF ? 0.f : expf(omx - nm);
        lsum = lsum * c1 + ol * c2;
#pragma unroll
        for (int d = 0; d < DH; ++d) {
          const float oa = __shfl_xor_sync(FD_FULL, acc[d], off);
          acc[d] = acc[d] * c1 + oa * c2;
        }
        mx = nm;
      }
      if (lane == 0) {
        s_m[warp] = mx;
        s_l[warp] = lsum;
#pragma unroll
        for (int d = 0; d < DH; ++d) s_acc[warp][d] = acc[d];
      }
      __syncthreads();
      if (threadIdx.x < DH) {
        const int d = threadIdx.x;
        float gm = NEG_INF;
        for (int w = 0; w < FD_WARPS; ++w) gm = fmaxf(gm, s_m[w]);
        float gl = 0.f, go = 0.f;
        for (int w = 0; w < FD_WARPS; ++w) {
          const float c = s_m[w] == NEG_INF ? 0.f : expf(s_m[w] - gm);
          gl += s_l[w] * c;
          go += s_acc[w][d] * c;
        }
        ao[(size_t)m * HD + h * DH + d] = go / gl;
      }
      __syncthreads();
    }
    fs_grid_sync(sync, ++phase * gridDim.x);
    // -- C: o_proj + residual -> hs
    for (int n = gw; n < D; n += nw) {
      float acc[FD_MAXM];
#pragma unroll
      for (int m = 0; m < FD_MAXM; ++m) acc[m] = 0.f;
      fs_dot_rows<T, HD, false>(ao, M, nullptr, wo + ((size_t)l * D + n) * HD, acc);
#pragma unroll
      for (int m = 0; m < FD_MAXM; ++m) {
        if (m < M) {
          const float s = fd_warp_sum(acc[m]);
          if (lane == 0) hs[(size_t)m * D + n] = __ldcg(x + (size_t)m * D + n) + s;
        }
      }
    }
    fs_grid_sync(sync, ++phase * gridDim.x);
    // -- D: norm + gate/up + SiLU(gate) * up -> act
    fs_row_rinv<D>(hs, M, EPS, rinv);
    for (int n = gw; n < F; n += nw) {
      float g[FD_MAXM], u[FD_MAXM];
#pragma unroll
      for (int m = 0; m < FD_MAXM; ++m) { g[m] = 0.f; u[m] = 0.f; }
      const T* w = wgu + (size_t)l * 2 * F * D;
      fs_dot_rows2<T, D, true, true>(
          hs, M, nw2 + l * D, w + (size_t)n * D, w + (size_t)(F + n) * D, g, u);
#pragma unroll
      for (int m = 0; m < FD_MAXM; ++m) {
        if (m < M) {
          const float gs = fd_warp_sum(g[m]) * rinv[m];
          const float us = fd_warp_sum(u[m]) * rinv[m];
          if (lane == 0) act[(size_t)m * F + n] = gs / (1.0f + expf(-gs)) * us;
        }
      }
    }
    fs_grid_sync(sync, ++phase * gridDim.x);
    // -- E: down + residual -> xs
    for (int n = gw; n < D; n += nw) {
      float acc[FD_MAXM];
#pragma unroll
      for (int m = 0; m < FD_MAXM; ++m) acc[m] = 0.f;
      fs_dot_rows<T, F, false>(act, M, nullptr, wdown + ((size_t)l * D + n) * F, acc);
#pragma unroll
      for (int m = 0; m < FD_MAXM; ++m) {
        if (m < M) {
          const float s = fd_warp_sum(acc[m]);
          if (lane == 0) xs[(size_t)m * D + n] = __ldcg(hs + (size_t)m * D + n) + s;
        }
      }
    }
    fs_grid_sync(sync, ++phase * gridDim.x);
    x = xs;
  }
  // -- head: final norm + LM head for rows [R0, M)
  if (HEAD_MODE != 0) {
    const int r0 = HEAD_MODE == 1 ? M - 1 : 0;
    const int rows = M - r0;
    fs_row_rinv<D>(xs + (size_t)r0 * D, rows, EPS, rinv);
    for (int n = 2 * gw; n < V; n += 2 * nw) {  // two outputs a warp: loads overlap
      const int n1 = n + 1 < V ? n + 1 : n;
      float acc[FD_MAXM], acc1[FD_MAXM];
#pragma unroll
      for (int m = 0; m < FD_MAXM; ++m) { acc[m] = 0.f; acc1[m] = 0.f; }
      fs_dot_rows2<T, D, true, true>(xs + (size_t)r0 * D, rows, nwf, whead + (size_t)n * D,
                                     whead + (size_t)n1 * D, acc, acc1);
#pragma unroll
      for (int m = 0; m < FD_MAXM; ++m) {
        if (m < rows) {
          const float s = fd_warp_sum(acc[m]) * rinv[m];
          const float s1 = fd_warp_sum(acc1[m]) * rinv[m];
          if (lane == 0) {
            logits[(size_t)m * V + n] = s;
            logits[(size_t)m * V + n1] = s1;
          }
        }
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
    s = shapes
    consts = {
        "D": s.hidden,
        "H": s.heads,
        "HKV": s.kv_heads,
        "DH": s.head_dim,
        "F": s.intermediate,
        "V": s.vocab,
        "L": num_layers,
        "EPS": f"{s.eps!r}f",
        "LOG2_BASE": f"{math.log2(s.rope_base)!r}f",
        "TRADITIONAL": "true" if s.rope_traditional else "false",
        "THREADS": THREADS,
    }
    lines = [f"  constexpr auto {k} = {v};" for k, v in consts.items()]
    keys = ", ".join(f"k{i}" for i in range(num_layers))
    values = ", ".join(f"v{i}" for i in range(num_layers))
    lines.append(f"  const T* KEYS[L] = {{{keys}}};")
    lines.append(f"  const T* VALUES[L] = {{{values}}};")
    return "\n".join(lines) + "\n" + _BODY


def input_names(num_layers: int) -> list[str]:
    caches = [f"k{i}" for i in range(num_layers)] + [f"v{i}" for i in range(num_layers)]
    return ["ids", "pos", "table", *_WEIGHTS, *caches]


def output_names() -> list[str]:
    return ["logits", "work", "sync_buf", "status"]


def work_size(shapes: Shapes) -> int:
    s = shapes
    HD = s.heads * s.head_dim
    return max(MAX_ROWS * (2 * HD + 2 * s.hidden + s.intermediate), _PRIVATE_PAGE_FLOATS)


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

    def __init__(self, shapes: Shapes, num_layers: int) -> None:
        reason = shapes.check()
        if reason:
            raise ValueError(f"fused step kernel: unsupported {reason}")
        self.s, self.L = shapes, num_layers
        tag = hashlib.sha1(f"{shapes!r}/{num_layers}".encode()).hexdigest()[:10]
        self.blocks = sm_count()
        self._kernel: Any = mx.fast.cuda_kernel(
            name=f"fs_step_{tag}",
            input_names=input_names(num_layers),
            output_names=output_names(),
            source=step_source(shapes, num_layers),
            header=_STEP_HEADER,
        )

    def __call__(
        self,
        ids: mx.array,
        pos: mx.array,
        table: mx.array,
        weights: list[mx.array],
        keys: list[mx.array],
        values: list[mx.array],
        head_mode: int,
    ) -> tuple[mx.array, mx.array]:
        """(logits [rows, V] f32, status [1] u32: nonzero if a barrier timed out).
        head_mode: 0 no logits, 1 the last row's, 2 every row's."""
        s = self.s
        M = ids.shape[0]
        if not 1 <= M <= MAX_ROWS:
            raise ValueError(f"a fused step takes 1..{MAX_ROWS} rows, not {M}")
        rows = {0: 1, 1: 1, 2: M}[head_mode]
        outs = self._kernel(
            inputs=[ids, pos, table, *weights, *keys, *values],
            template=[("T", weights[1].dtype), ("HEAD_MODE", head_mode)],
            grid=(self.blocks * THREADS, 1, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(rows, s.vocab), (work_size(s),), (_PRIVATE_PAGE_FLOATS,), (1,)],
            output_dtypes=[mx.float32, mx.float32, mx.uint32, mx.uint32],
            init_value=0,
        )
        return outs[0], outs[3]
