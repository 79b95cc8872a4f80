"""Fused CUDA kernels for decode and verify steps of full-attention decoders (Llama family).

A naive MLX decode step of the default model on an H200 is launch-bound: ~20 small
kernels per layer, each with its own host-side cost. Here a layer is five kernels:

    qkv      RMSNorm + fused q/k/v projection + RoPE           -> q (f32), new k/v rows
    attend   attention of each query row over the KV buffer     -> per-head outputs (f32)
    out      o_proj + residual add                              -> h
    gate_up  RMSNorm + gate/up projection + SiLU(gate) * up     -> act
    down     down projection + residual add                     -> next x

plus `head` (final RMSNorm + LM head). The residual stream and every accumulator are
float32; weights and KV rows stay in the model dtype.

Row invariance. Every kernel computes each of the M <= MAX_ROWS query rows with the
same instructions in the same order whatever M is (a warp walks the weight row once
and accumulates each token row separately; attention of row m depends only on its own
position). So the logits of a k+1-row verify are bit-identical to k+1 one-row decode
steps, and greedy speculative decoding reproduces plain decoding exactly on the GPU
too, in bfloat16.

Reference semantics: `kernels.fused_decode_ref` (MLX ops, any device), which the GPU
tests compare against. Only built where MLX runs on CUDA.
"""

from __future__ import annotations

import hashlib
from typing import Any

import mlx.core as mx

from kernels.fused_shapes import Shapes

MAX_ROWS = 16  # query rows per call: a draft of up to 15 tokens plus the pending one
WARPS = 8  # warps per block in the projection kernels
ATTEND_THREADS = 256
HEAD_OUTPUTS_PER_WARP = 8

_HEADER = r"""
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
"""

_QKV = r"""
  // x [M, D] f32, nw [D] f32, w [(H + 2 HKV) * DH, D], pos [1] int32
  // -> q [M, H * DH] f32 (roped), k_rows / v_rows [HKV, M, DH] (roped k) in T
  const int M = x_shape[0];
  __shared__ float rinv[FD_MAXM];
  fd_row_rinv(x, M, D, EPS, rinv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int p = blockIdx.x * FD_WARPS + warp;  // one warp: one pair of outputs
  if (p >= (H + 2 * HKV) * DH / 2) return;
  int n0, n1, fi;
  fd_qkv_pair<H, HKV, DH, TRADITIONAL>(p, n0, n1, fi);
  float a0[FD_MAXM], a1[FD_MAXM];
#pragma unroll
  for (int m = 0; m < FD_MAXM; ++m) { a0[m] = 0.f; a1[m] = 0.f; }
  fd_dot_rows<T, D, true>(x, M, nw, w + (size_t)n0 * D, a0);
  fd_dot_rows<T, D, true>(x, M, nw, w + (size_t)n1 * D, a1);
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
          sincosf(static_cast<float>(pos[0] + m) * inv_freq, &sn, &cs);
          const float r0 = s0 * cs - s1 * sn;
          s1 = s0 * sn + s1 * cs;
          s0 = r0;
        }
        if (head < H) {
          q[m * H * DH + n0] = s0;
          q[m * H * DH + n1] = s1;
        } else if (head < H + HKV) {
          const size_t base = ((size_t)(head - H) * M + m) * DH;
          k_rows[base + d0] = static_cast<T>(s0);
          k_rows[base + d1] = static_cast<T>(s1);
        } else {
          const size_t base = ((size_t)(head - H - HKV) * M + m) * DH;
          v_rows[base + d0] = static_cast<T>(s0);
          v_rows[base + d1] = static_cast<T>(s1);
        }
      }
    }
  }
"""

_ATTEND = r"""
  // q [M, H * DH] f32, keys / values [HKV, CAP, DH] T, pos [1] int32 -> o [M, H * DH] f32
  // Block (h, m): query row m (position pos + m) of head h over keys 0 .. pos + m.
  const int h = blockIdx.x, m = blockIdx.y;
  const int cap = keys_shape[1];
  const int n = pos[0] + m + 1;
  const int kvh = h / (H / HKV);
  const float NEG_INF = __int_as_float(0xff800000);
  float qv[DH], acc[DH];
  const float scale = rsqrtf(static_cast<float>(DH));
#pragma unroll
  for (int d = 0; d < DH; ++d) {
    qv[d] = q[(size_t)m * H * DH + h * DH + d] * scale;
    acc[d] = 0.f;
  }
  float mx = NEG_INF, l = 0.f;
  const T* kb = keys + (size_t)kvh * cap * DH;
  const T* vb = values + (size_t)kvh * cap * DH;
  for (int j = threadIdx.x; j < n; j += THREADS) {
    float s = 0.f;
#pragma unroll
    for (int d = 0; d < DH; d += 8) {
      float kv[8];
      fd_load8(kb + (size_t)j * DH + d, kv);
#pragma unroll
      for (int i = 0; i < 8; ++i) s += qv[d + i] * kv[i];
    }
    float c = 1.f, e = 1.f;
    if (s > mx) { c = expf(mx - s); mx = s; } else { e = expf(s - mx); }
    l = l * c + e;
#pragma unroll
    for (int d = 0; d < DH; d += 8) {
      float vv[8];
      fd_load8(vb + (size_t)j * DH + d, vv);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[d + i] = acc[d + i] * c + e * vv[i];
    }
  }
  // combine the lanes of each warp (symmetric: every lane ends with the same values)
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float omx = __shfl_xor_sync(FD_FULL, mx, off);
    const float ol = __shfl_xor_sync(FD_FULL, l, off);
    const float nm = fmaxf(mx, omx);
    const float c1 = mx == NEG_INF ? 0.f : expf(mx - nm);
    const float c2 = omx == NEG_INF ? 0.f : expf(omx - nm);
    l = l * c1 + ol * c2;
#pragma unroll
    for (int d = 0; d < DH; ++d) {
      const float oa = __shfl_xor_sync(FD_FULL, acc[d], off);
      acc[d] = acc[d] * c1 + oa * c2;
    }
    mx = nm;
  }
  constexpr int NW = THREADS / 32;
  __shared__ float s_m[NW], s_l[NW], s_acc[NW][DH];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_m[warp] = mx;
    s_l[warp] = l;
#pragma unroll
    for (int d = 0; d < DH; ++d) s_acc[warp][d] = acc[d];
  }
  __syncthreads();
  if (threadIdx.x < DH) {
    const int d = threadIdx.x;
    float gm = NEG_INF;
    for (int w = 0; w < NW; ++w) gm = fmaxf(gm, s_m[w]);
    float gl = 0.f, go = 0.f;
    for (int w = 0; w < NW; ++w) {
      const float c = s_m[w] == NEG_INF ? 0.f : expf(s_m[w] - gm);
      gl += s_l[w] * c;
      go += s_acc[w][d] * c;
    }
    o[(size_t)m * H * DH + h * DH + d] = go / gl;
  }
"""

_RESIDUAL = r"""
  // a [M, K] f32, w [N, K] T, res [M, N] f32 -> y [M, N] = res + a @ w.T
  const int M = a_shape[0];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * FD_WARPS + warp;
  if (n >= N) return;
  float acc[FD_MAXM];
#pragma unroll
  for (int m = 0; m < FD_MAXM; ++m) acc[m] = 0.f;
  fd_dot_rows<T, K, false>(a, M, nullptr, w + (size_t)n * K, acc);
#pragma unroll
  for (int m = 0; m < FD_MAXM; ++m) {
    if (m < M) {
      const float s = fd_warp_sum(acc[m]);
      if (lane == 0) y[(size_t)m * N + n] = res[(size_t)m * N + n] + s;
    }
  }
"""

_GATE_UP = r"""
  // x [M, D] f32, nw [D] f32, w [2F, D] T (gate rows, then up rows) -> act [M, F] f32
  const int M = x_shape[0];
  __shared__ float rinv[FD_MAXM];
  fd_row_rinv(x, M, D, EPS, rinv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * FD_WARPS + warp;
  if (n >= F) return;
  float g[FD_MAXM], u[FD_MAXM];
#pragma unroll
  for (int m = 0; m < FD_MAXM; ++m) { g[m] = 0.f; u[m] = 0.f; }
  fd_dot_rows<T, D, true>(x, M, nw, w + (size_t)n * D, g);
  fd_dot_rows<T, D, true>(x, M, nw, w + (size_t)(F + n) * D, u);
#pragma unroll
  for (int m = 0; m < FD_MAXM; ++m) {
    if (m < M) {
      const float gs = fd_warp_sum(g[m]) * rinv[m];
      const float us = fd_warp_sum(u[m]) * rinv[m];
      if (lane == 0) act[(size_t)m * F + n] = gs / (1.0f + expf(-gs)) * us;
    }
  }
"""

_HEAD = r"""
  // x [M, D] f32, nw [D] f32, w [V, D] T -> logits [M, V] f32
  const int M = x_shape[0];
  __shared__ float rinv[FD_MAXM];
  fd_row_rinv(x, M, D, EPS, rinv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first = (blockIdx.x * FD_WARPS + warp) * NPW;
  for (int r = 0; r < NPW; ++r) {
    const int n = first + r;
    if (n >= V) return;
    float acc[FD_MAXM];
#pragma unroll
    for (int m = 0; m < FD_MAXM; ++m) acc[m] = 0.f;
    fd_dot_rows<T, D, true>(x, M, nw, w + (size_t)n * D, acc);
#pragma unroll
    for (int m = 0; m < FD_MAXM; ++m) {
      if (m < M) {
        const float s = fd_warp_sum(acc[m]) * rinv[m];
        if (lane == 0) logits[(size_t)m * V + n] = s;
      }
    }
  }
"""


def constants(shapes: Shapes, **extra: int) -> str:
    """The model's shapes as C++ constants (D, H, HKV, DH, F, V, EPS, LOG2_BASE,
    TRADITIONAL), then `extra`, one line each, for a kernel body to start with."""
    import math

    s = shapes
    consts: dict[str, object] = {
        "D": s.hidden,
        "H": s.heads,
        "HKV": s.kv_heads,
        "DH": s.head_dim,
        "F": s.intermediate,
        "V": s.vocab,
        "EPS": f"{s.eps!r}f",
        "LOG2_BASE": f"{math.log2(s.rope_base)!r}f",
        "TRADITIONAL": "true" if s.rope_traditional else "false",
        **extra,
    }
    return "\n".join(f"  constexpr auto {k} = {v};" for k, v in consts.items())


def source_of(kind: str, shapes: Shapes) -> str:
    """The kernel body with this model's constants baked in (also used by the compile check)."""
    body = {"qkv": _QKV, "attend": _ATTEND, "gate_up": _GATE_UP, "head": _HEAD}.get(kind)
    if body is None:  # residual kernels: K and N come from the call's template arguments
        return _RESIDUAL
    return constants(shapes, THREADS=ATTEND_THREADS, NPW=HEAD_OUTPUTS_PER_WARP) + "\n" + body


_SIGNATURES = {
    "qkv": (["x", "nw", "w", "pos"], ["q", "k_rows", "v_rows"]),
    "attend": (["q", "keys", "values", "pos"], ["o"]),
    "residual": (["a", "w", "res"], ["y"]),
    "gate_up": (["x", "nw", "w"], ["act"]),
    "head": (["x", "nw", "w"], ["logits"]),
}


def header() -> str:
    return _HEADER


def is_available() -> bool:
    """True where MLX's default device is a CUDA GPU."""
    try:
        return bool(mx.default_device() == mx.gpu and mx.cuda.is_available())
    except AttributeError:
        return False


class CudaKernels:
    """The five per-layer kernels and the head, built for one model's shapes."""

    def __init__(self, shapes: Shapes) -> None:
        reason = shapes.check()
        if reason:
            raise ValueError(f"fused decode kernels: unsupported {reason}")
        self.s = shapes
        tag = hashlib.sha1(repr(shapes).encode()).hexdigest()[:10]
        self._k: dict[str, Any] = {}
        for kind, (inputs, outputs) in _SIGNATURES.items():
            self._k[kind] = mx.fast.cuda_kernel(
                name=f"fd_{kind}_{tag}",
                input_names=inputs,
                output_names=outputs,
                source=source_of(kind, shapes),
                header=_HEADER,
            )

    def qkv(self, x: mx.array, nw: mx.array, w: mx.array, pos: mx.array) -> list[mx.array]:
        s = self.s
        M = x.shape[0]
        pairs = (s.heads + 2 * s.kv_heads) * s.head_dim // 2
        return self._k["qkv"](
            inputs=[x, nw, w, pos],
            template=[("T", w.dtype)],
            grid=(_blocks(pairs, WARPS) * 32 * WARPS, 1, 1),
            threadgroup=(32 * WARPS, 1, 1),
            output_shapes=[
                (M, s.heads * s.head_dim),
                (s.kv_heads, M, s.head_dim),
                (s.kv_heads, M, s.head_dim),
            ],
            output_dtypes=[mx.float32, w.dtype, w.dtype],
        )

    def attend(self, q: mx.array, keys: mx.array, values: mx.array, pos: mx.array) -> mx.array:
        s = self.s
        M = q.shape[0]
        return self._k["attend"](
            inputs=[q, keys, values, pos],
            template=[("T", keys.dtype)],
            grid=(ATTEND_THREADS * s.heads, M, 1),
            threadgroup=(ATTEND_THREADS, 1, 1),
            output_shapes=[(M, s.heads * s.head_dim)],
            output_dtypes=[mx.float32],
        )[0]

    def residual(self, a: mx.array, w: mx.array, res: mx.array) -> mx.array:
        N, K = w.shape
        return self._k["residual"](
            inputs=[a, w, res],
            template=[("T", w.dtype), ("K", K), ("N", N)],
            grid=(_blocks(N, WARPS) * 32 * WARPS, 1, 1),
            threadgroup=(32 * WARPS, 1, 1),
            output_shapes=[(a.shape[0], N)],
            output_dtypes=[mx.float32],
        )[0]

    def gate_up(self, x: mx.array, nw: mx.array, w: mx.array) -> mx.array:
        F = self.s.intermediate
        return self._k["gate_up"](
            inputs=[x, nw, w],
            template=[("T", w.dtype)],
            grid=(_blocks(F, WARPS) * 32 * WARPS, 1, 1),
            threadgroup=(32 * WARPS, 1, 1),
            output_shapes=[(x.shape[0], F)],
            output_dtypes=[mx.float32],
        )[0]

    def head(self, x: mx.array, nw: mx.array, w: mx.array) -> mx.array:
        V = self.s.vocab
        warps = -(-V // HEAD_OUTPUTS_PER_WARP)
        return self._k["head"](
            inputs=[x, nw, w],
            template=[("T", w.dtype)],
            grid=(_blocks(warps, WARPS) * 32 * WARPS, 1, 1),
            threadgroup=(32 * WARPS, 1, 1),
            output_shapes=[(x.shape[0], V)],
            output_dtypes=[mx.float32],
        )[0]


def _blocks(items: int, per_block: int) -> int:
    return -(-items // per_block)


def kernels_for(shapes: Shapes) -> Any:
    """The CUDA kernels on a CUDA GPU, else the MLX-ops reference (same contract)."""
    if is_available():
        return CudaKernels(shapes)
    from kernels.fused_decode_ref import ReferenceKernels

    return ReferenceKernels(shapes)
