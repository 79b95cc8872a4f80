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
tests compare against. The CUDA text is in kernels/cuda/fused_decode*.cu(h); only built
where MLX runs on CUDA.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import mlx.core as mx

from kernels import cuda
from kernels.fused_shapes import Shapes

MAX_ROWS = 16  # query rows per call: a draft of up to 15 tokens plus the pending one
WARPS = 8  # warps per block in the projection kernels
ATTEND_THREADS = 256
HEAD_OUTPUTS_PER_WARP = 8

_HEADER = cuda.source("fused_decode.cuh")
_BODIES = {
    kind: cuda.source(f"fused_decode_{kind}.cu")
    for kind in ("qkv", "attend", "residual", "gate_up", "head")
}


def constants(shapes: Shapes, **extra: int | str) -> str:
    """The model's shapes as C++ constants (D, H, HKV, DH, F, V, EPS, LOG2_BASE,
    TRADITIONAL), then `extra`, one line each, for a kernel body to start with."""
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
    body = _BODIES[kind]
    if kind == "residual":  # K and N come from the call's template arguments
        return body
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


is_available = cuda.is_available  # where MLX's default device is a CUDA GPU


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
