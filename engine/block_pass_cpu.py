"""The block drafter's pass as one C call on the NumPy backend (kernels/csrc/step.c).

The drafter is a small Llama decoder over its own K/V cache: its layers are the C step's
layers, its draft-vocabulary head the step's head. So the step's plan computes a pass
from the block's input rows (the pending token's embedding, then the mask rows) through
every layer to each row's logits, in one call. Op by op (`BlockDrafter.block_logits`),
the same pass is ~100 NumPy calls between its matmuls: about half of its ~1 ms at k = 4
on a 2-core CPU.

The context's K/V rows sit in the drafter's caches from slot 0, rotated at their slots
(engine/block_drafter.py); the step rotates row i of a call at slot `offset + i` by table
row `offset + i`, as the drafter does. The block's own K/V rows land past the caches'
cursors, where the next context rows overwrite them: nothing a draft wrote is read as
context (engine/block_drafter.py, fact 2).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.drafter_file import BlockDrafterWeights
from engine.kv_state import FullKV
from engine.runner.cpu_step import (
    ACTIVATIONS,
    extension,
    ops_reason,
    weight_parts,
    weight_reason,
)

F32 = np.float32


def unsupported_reason(weights: BlockDrafterWeights, ops: Any) -> str | None:
    """Why the C step cannot run this drafter's pass here, or None."""
    reason = ops_reason(ops)
    if reason is not None:
        return reason
    linears = [weights.head] + [
        w for layer in weights.layers for name, w in layer.items() if "norm" not in name
    ]
    return next((r for r in map(weight_reason, linears) if r), None)


class CpuPass:
    """A drafter's plan in the C step, and its passes."""

    def __init__(self, weights: BlockDrafterWeights, ops: Any) -> None:
        reason = unsupported_reason(weights, ops)
        if reason is not None:
            raise ValueError(f"the C step cannot run this drafter's pass: {reason}")
        s = weights.shape
        self.ops, self.shape, self.vocab_size = ops, s, len(weights.vocab)
        sizes = (s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, self.vocab_size)
        layers = tuple(
            (
                layer["input_norm"],
                layer["post_norm"],
                None,  # no sandwich norms
                None,
                weight_parts(layer["q_proj"]) + weight_parts(layer["kv_proj"]),  # q | k | v
                None,  # no q/k/v bias
                None,  # no q/k norms
                None,
                weight_parts(layer["o_proj"]),
                weight_parts(layer["gate_up"]),
                weight_parts(layer["down_proj"]),
                0,  # the one rope
                0,  # full attention
                float(s.head_dim**-0.5),
            )
            for layer in weights.layers
        )
        self.plan = extension().step_plan(
            sizes,
            float(s.eps),
            ACTIVATIONS["silu"],
            ((s.head_dim, 0, 1.0),),  # rope dims, not traditional, no scale
            weights.final_norm,
            weight_parts(weights.head),
            layers,
        )

    def logits(self, x: np.ndarray, kvs: list[FullKV]) -> np.ndarray:
        """Every row's draft-vocabulary logits [L, N] for input rows x [L, D] after the
        caches' n context rows (rotated at 0..n - 1: engine/block_drafter.py)."""
        rows = int(x.shape[0])
        n = kvs[0].length
        end = n + rows
        cos, sin = self.ops._rope_table(self.shape.head_dim, self.shape.rope_base, end, None)
        tables = ((cos, sin),)
        caches = []
        for kv in kvs:
            kv._make_room(end)  # the block's rows past the cursor
            caches.append((kv.keys, kv.values))
        out = np.empty((rows, self.vocab_size), dtype=F32)
        residual = np.ascontiguousarray(x, dtype=F32)  # the step's residual stream, in place
        extension().step_run(self.plan, residual, n, tuple(caches), tables, out)
        return out
