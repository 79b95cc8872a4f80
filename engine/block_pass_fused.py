"""The block drafter's pass as one launch of the fused step kernel, on CUDA.

A pass is a verify of the block's rows through the drafter's layers: the pending token
and `block - 1` mask rows, appended after the context's K/V rows, attending to all of
them and causally among themselves, each row rotated at its cache slot, every row's
logits over the draft vocabulary. That is what `kernels/fused_step_cuda.py`'s verify
build computes for a decoder, so the drafter is handed to it as one: its layers' matrices
(q|k|v, o, gate|up, down), its head (the target's embedding rows of the draft
vocabulary) and an embedding table of two parts, the target's embedding as stored and
the mask row after it (token id = the target's vocabulary size). Traced op by op with
`mx.compile` (engine/block_pass_mlx.py) the pass is ~40 launches and cost 1.5-1.9 ms on
an H100; this is one.

The kernel writes the block's K/V rows into the context's buffers past their length, as
a verify writes a target's; the length stays, so the next rows written over them are the
context's (the drafter's rows are never read as context). The kernel's position is also
the cache's row: the drafter rotates its rows at their slots (engine/block_drafter.py).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from engine.block_pass_mlx import top1
from engine.drafter_file import BlockDrafterWeights
from engine.kv_state import FullKV, reserve_alike
from engine.models.base import DecoderModel
from kernels import fused_decode_cuda, step_weights
from kernels.fused_shapes import Shapes
from kernels.row_parts import RowParts

_CAPACITY_STEP = 1024  # the caches grow in large steps: the kernel's scratch follows them


def unsupported_reason(weights: BlockDrafterWeights, target: DecoderModel) -> str | None:
    """Why the pass can't be one launch here, or None."""
    if target.ops.name != "mlx" or not fused_decode_cuda.is_available():
        return "the fused step runs on CUDA only"
    if target.config.embed_scale != 1.0:
        return "a scaled embedding (the mask row would be scaled with it)"
    if weights.shape.block > fused_decode_cuda.MAX_ROWS:
        return f"a block of {weights.shape.block} rows (at most {fused_decode_cuda.MAX_ROWS})"
    for name, w in _matrices(weights, target).items():
        if reason := step_weights.matrix_unsupported(w):
            return f"its {name}: {reason}"
    return None


def _matrices(weights: BlockDrafterWeights, target: DecoderModel) -> dict[str, Any]:
    """The kernel's matrices by name, in its order."""
    ops: Any = target.ops
    out: dict[str, Any] = {}
    for i, layer in enumerate(weights.layers):
        out[f"layer {i} q|k|v"] = mx.concatenate([layer["q_proj"], layer["kv_proj"]])
        out[f"layer {i} o"] = layer["o_proj"]
        out[f"layer {i} gate|up"] = layer["gate_up"]
        out[f"layer {i} down"] = layer["down_proj"]
    out["head"] = weights.head
    embed = getattr(ops, "stored", lambda w: w)(target.embed)
    rows = int(target.config.vocab_size)
    mask = mx.array(np.asarray(ops.to_numpy(weights.mask_embedding), dtype=np.float32))
    out["embedding table"] = RowParts((embed, mask), (rows, 1), int(weights.shape.hidden))
    return out


def drafter_step(
    weights: BlockDrafterWeights, target: DecoderModel
) -> tuple[step_weights.WeightTable, Shapes, list[mx.array]]:
    """The drafter as the step kernel takes a decoder (on any MLX device): its weight
    table, its shapes (the vocabulary: the draft vocabulary's rows of the head) and its
    norm inputs (kernels/fused_step_cuda.py's: norms, the rotation's inverse frequencies,
    no q/k norm, no sandwich norms)."""
    s = weights.shape
    table = step_weights.build(list(_matrices(weights, target).values()), 4 * s.layers)
    shapes = Shapes(
        hidden=s.hidden,
        heads=s.heads,
        kv_heads=s.kv_heads,
        head_dim=s.head_dim,
        intermediate=s.intermediate,
        vocab=len(weights.vocab),
        eps=s.eps,
        rope_base=s.rope_base,
        rope_traditional=False,
    )
    inv_freq = 1.0 / s.rope_base ** (np.arange(0, s.head_dim, 2, dtype=np.float64) / s.head_dim)
    one = mx.zeros((1,), dtype=mx.float32)
    norms = [
        mx.stack([layer["input_norm"].astype(mx.float32) for layer in weights.layers]),
        mx.stack([layer["post_norm"].astype(mx.float32) for layer in weights.layers]),
        weights.final_norm.astype(mx.float32),
        mx.array(inv_freq.astype(np.float32)),
        one,
        one,
        one,
        one,
    ]
    mx.eval(*norms)
    return table, shapes, norms


class PassTimedOut(RuntimeError):
    """A grid barrier of the pass's launch timed out: not every block was resident (a
    smaller or shared GPU). Nothing was read; the drafter takes its traced pass."""


class FusedPass:
    """`greedy(pending, kv, k)`: block rows 1..k's top draft-vocabulary index and its
    softmax probability (NumPy); `logits(pending, kv, k)`: their logits [k, N] float32
    (MLX). `kv`: the drafter's per-layer context caches."""

    def __init__(self, weights: BlockDrafterWeights, target: DecoderModel) -> None:
        from kernels.fused_step_cuda import StepKernel, tuning_for

        if reason := unsupported_reason(weights, target):
            raise ValueError(f"the drafter's fused pass: {reason}")
        s = weights.shape
        self.block, self.mask_id = s.block, int(target.config.vocab_size)
        self.table, self.shapes, self.norms = drafter_step(weights, target)
        tuning = tuning_for(self.table.layer_bytes)
        if tuning.get("FQ_WIDE"):
            step_weights.check_wide(self.table)
        self.kernel = StepKernel.for_table(self.shapes, s.layers, self.table, tuning)
        self._top1 = mx.compile(lambda out: top1(out[1:]))  # traced per row count

    def logits(self, pending: int, kv: list[FullKV], k: int) -> mx.array:
        out, status = self._queue(pending, kv, k)
        mx.eval(out, status)
        _check(status)
        return out[1:]

    def greedy(self, pending: int, kv: list[FullKV], k: int) -> tuple[np.ndarray, np.ndarray]:
        out, status = self._queue(pending, kv, k)
        top, probability = self._top1(out)
        mx.eval(top, probability, status)  # one wait for the device
        _check(status)
        return np.array(top), np.array(probability, dtype=np.float32)

    def _queue(self, pending: int, kv: list[FullKV], k: int) -> tuple[mx.array, mx.array]:
        """The logits [k + 1, N] of the block's first k + 1 rows (causal inside the block:
        what the whole block gives them, for a verify's cost of k + 1 rows) and the launch's
        status, not evaluated; the caches' lengths stay."""
        n = kv[0].length
        reserve_alike(kv, n + self.block, _CAPACITY_STEP)
        ids = mx.array([pending] + [self.mask_id] * k, dtype=mx.int32)
        pos = mx.array([n], dtype=mx.int32)
        keys, values = [c.keys for c in kv], [c.values for c in kv]
        out, status = self.kernel(ids, pos, self.table, self.norms, keys, values, head_mode=2)
        return out, status


def _check(status: mx.array) -> None:
    """PassTimedOut where a barrier of the launch timed out (not every block resident)."""
    if status.item():
        raise PassTimedOut("the drafter's fused pass timed out at a grid barrier")
