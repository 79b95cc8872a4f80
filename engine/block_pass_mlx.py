"""The block drafter's pass on an MLX GPU, traced once with `mx.compile`
(EngineConfig.drafter_compile).

Run op by op, a pass is ~70 small operations, each paying MLX's per-operation cost: on the
H200 a pass took 1.4-2.1 ms for any k, more than the target's whole one-launch step
(1.3 ms), so it was all overhead (docs/BENCHMARKS.md, "The block drafter on the H200").
Traced, its elementwise chains fuse and the graph is replayed from C++.

A trace is kept per input shape, so the shapes here change only when the context's
buffers grow (FullKV's geometric capacity):
- the whole block every time (the first k + 1 rows equal what a pass of k + 1 rows gives:
  attention inside the block is causal), the caller reading the k it asked for;
- the context's keys and values as their full-capacity buffers, the rows past the ones
  held masked out, and the block's own rows after them;
- the position and the count of context rows as arrays, not constants of the trace.

The attention is `kernels/few_query_attention.py`'s float32 matmuls (CUDA's for a
verify's rows): no per-shape library graph inside the trace either.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from engine.drafter_file import BlockDrafterWeights
from kernels.few_query_attention import few_query_attention
from kernels.ops import Ops


def top1(rows: mx.array) -> tuple[mx.array, mx.array]:
    """Each row's top index and its softmax probability (the top term is exp(0) = 1)."""
    top = mx.argmax(rows, axis=-1)
    peak = mx.take_along_axis(rows, top[:, None], axis=-1)
    return top, 1.0 / mx.exp(rows - peak).sum(axis=-1)


class CompiledPass:
    """`greedy(...)`: each block row's top draft-vocabulary index and its softmax
    probability; `logits(...)`: the rows' draft-vocabulary logits [block - 1, N] float32."""

    def __init__(self, weights: BlockDrafterWeights, ops: Ops) -> None:
        self.w, self.ops = weights, ops
        self._greedy = mx.compile(self._top1)
        self._logits = mx.compile(self._pass)

    def greedy(self, x0: mx.array, position: int, rows: int, buffers: list[mx.array]) -> Any:
        top, probability = self._greedy(x0, *self._scalars(position, rows), *buffers)
        mx.eval(top, probability)  # one wait for the device
        return top, probability

    def logits(self, x0: mx.array, position: int, rows: int, buffers: list[mx.array]) -> Any:
        out = self._logits(x0, *self._scalars(position, rows), *buffers)
        mx.eval(out)
        return out

    @staticmethod
    def _scalars(position: int, rows: int) -> tuple[mx.array, mx.array]:
        return mx.array(position, dtype=mx.int32), mx.array(rows, dtype=mx.int32)

    def _top1(self, x0: mx.array, position: mx.array, rows: mx.array, *buffers: mx.array) -> Any:
        return top1(self._pass(x0, position, rows, *buffers))

    def _pass(self, x0: mx.array, position: mx.array, rows: mx.array, *buffers: mx.array) -> Any:
        """x0 [1, D]: the pending token's embedding; buffers: each layer's keys and values
        [KVH, C, Dh], rows [0, rows) the context."""
        ops, w, s = self.ops, self.w, self.w.shape
        L, C = s.block, int(buffers[0].shape[1])
        x = mx.concatenate([x0, mx.repeat(w.mask_embedding.reshape(1, -1), L - 1, axis=0)])
        column = mx.arange(C + L)[None, :]
        row = mx.arange(L)[:, None]
        allowed = mx.where(column < C, column < rows, column - C <= row)  # [L, C + L]
        width = s.kv_heads * s.head_dim
        for layer, keys, values in zip(w.layers, buffers[0::2], buffers[1::2], strict=True):
            a = mx.fast.rms_norm(x, layer["input_norm"], s.eps)
            q = self._rope(self._heads(ops.linear(a, layer["q_proj"]), s.heads), position)
            kv = ops.linear(a, layer["kv_proj"])
            k = self._rope(self._heads(kv[:, :width], s.kv_heads), position)
            v = self._heads(kv[:, width:], s.kv_heads)
            # the block's rows and queries in the cache's dtype, as the pass op by op
            # hands them to the same attention (float32 inside, its result in that dtype)
            cache = keys.dtype
            keys = mx.concatenate([keys, k.astype(cache)], axis=1)
            values = mx.concatenate([values, v.astype(cache)], axis=1)
            att = few_query_attention(
                q.astype(cache)[None], keys[None], values[None], s.head_dim**-0.5, allowed
            )[0]
            att = att.transpose(1, 0, 2).reshape(L, s.heads * s.head_dim)
            x = x + ops.linear(att, layer["o_proj"])
            b = mx.fast.rms_norm(x, layer["post_norm"], s.eps)
            gate_up = ops.linear(b, layer["gate_up"])
            F = s.intermediate
            x = x + ops.linear(ops.silu(gate_up[:, :F]) * gate_up[:, F:], layer["down_proj"])
        out = ops.linear(mx.fast.rms_norm(x[1:], w.final_norm, s.eps), w.head)
        return out.astype(mx.float32)

    def _heads(self, x: mx.array, heads: int) -> mx.array:
        """[L, heads * Dh] -> [heads, L, Dh]"""
        return x.reshape(int(x.shape[0]), heads, self.w.shape.head_dim).transpose(1, 0, 2)

    def _rope(self, x: mx.array, position: mx.array) -> mx.array:
        s = self.w.shape
        return mx.fast.rope(
            x, s.head_dim, traditional=False, base=s.rope_base, scale=1.0, offset=position
        )
