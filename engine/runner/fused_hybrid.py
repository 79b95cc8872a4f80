"""A hybrid's linear layers (Gated DeltaNet) through the one-launch step.

The step reads the linear layers' conv windows and matrix states stacked (`cstack`,
`sstack`) and returns new stacks (`gconv`, `gstate`: kernels/fused_step_layers.py), so
the state it read stays as it was and a snapshot stays a reference. Each layer's
`RecurrentState` holds its views of the new stacks; while every layer still holds them,
the next launch reads the stacks whole (`Stacks`): a decode step costs no per-layer copy.
While a verify is recorded, each layer's tape gets the rows the kernel computed (conv
input, q, k, v, g, beta), which `RecurrentState.replay_verified` folds in with the
recurrent kernel whose row is the step's own (kernels/cuda/gated_delta_row.cuh): the kept
rows' state is the one their single steps give, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import mlx.core as mx

from engine.models.base import LINEAR, DecoderModel, ModelConfig
from engine.models.qwen3_5 import GatedDeltaNet
from engine.models.qwen3_5_gguf import VALUE_HEAD_ORDER
from engine.recurrent_state import TapeRows
from engine.state import FullKV, RecurrentState, SlidingKV
from kernels import fused_step_layers
from kernels.fused_shapes import GdnShapes, Shapes


def linear_shapes(cfg: ModelConfig) -> GdnShapes | None:
    """The linear layers' shapes, or None for a model without any."""
    layers = tuple(i for i in range(cfg.num_layers) if cfg.layer_type(i) == LINEAR)
    if not layers:
        return None
    return GdnShapes(
        layers=layers,
        key_heads=cfg.linear_num_key_heads,
        value_heads=cfg.linear_num_value_heads,
        key_dim=cfg.linear_key_head_dim,
        value_dim=cfg.linear_value_head_dim,
        conv_kernel=cfg.linear_conv_kernel_dim,
        tiled=cfg.extra.get(VALUE_HEAD_ORDER) == "tiled",
    )


def mixers_unsupported(model: DecoderModel) -> str | None:
    """Why a linear layer's mixer can't go through the step, or None."""
    for i, layer in enumerate(model.layers):
        if model.config.layer_type(i) == LINEAR and not isinstance(layer.mixer, GatedDeltaNet):
            return f"layer {i}'s linear mixer {type(layer.mixer).__name__}"
    return None


def params(model: DecoderModel) -> list[mx.array]:
    """gconvw [G, C, K] and gvec [G, 2 NV + DV] (-A, dt_bias, the gated norm), float32."""
    mixers = [layer.mixer for layer in model.layers if isinstance(layer.mixer, GatedDeltaNet)]
    convw = mx.stack([m.conv_weight.astype(mx.float32) for m in mixers])
    vec = mx.stack(
        [mx.concatenate([m.neg_A, m.dt_bias, m.norm]).astype(mx.float32) for m in mixers]
    )
    mx.eval(convw, vec)
    return [convw, vec]


def split_layers(
    layers: list[Any],
) -> tuple[list[FullKV | SlidingKV], list[RecurrentState]] | None:
    """The attention layers' KV (caches and sliding rings, in layer order) and the linear
    layers' states, or None if a layer is none of them."""
    kvs = [layer for layer in layers if isinstance(layer, (FullKV, SlidingKV))]
    recurrent = [layer for layer in layers if isinstance(layer, RecurrentState)]
    if len(kvs) + len(recurrent) != len(layers) or not kvs:
        return None
    return kvs, recurrent


@dataclass(frozen=True)
class Stacks:
    """One launch's new conv windows and matrix states (`gconv`, `gstate`) and the views
    of them each linear layer was given (`adopt`), in layer order."""

    gconv: mx.array
    gstate: mx.array
    convs: tuple[mx.array, ...]
    ssms: tuple[mx.array, ...]

    def hold(self, recurrent: list[RecurrentState]) -> bool:
        """Whether every layer still holds the views it was given (arrays are immutable:
        the same array is the same values)."""
        return len(recurrent) == len(self.convs) and all(
            r.conv is c and r.ssm is s
            for r, c, s in zip(recurrent, self.convs, self.ssms, strict=True)
        )


def linear_inputs(
    recurrent: list[RecurrentState], last: Stacks | None = None
) -> tuple[mx.array, mx.array]:
    """The step's `cstack` (conv windows [G, K - 1, C], one dtype: the first's, the
    kernel's TC) and `sstack` (float32 matrix states, flat). The last launch's outputs
    as they are when every layer still holds its view of them (decoding on: no copy, no
    per-layer node), else stacked from the layers (a rollback, another state)."""
    if last is not None and last.hold(recurrent):
        return last.gconv, last.gstate
    conv_dtype = recurrent[0].conv.dtype

    def as_dtype(a: mx.array, dtype: mx.Dtype) -> mx.array:
        return a if a.dtype == dtype else a.astype(dtype)

    convs = mx.stack([as_dtype(r.conv, conv_dtype) for r in recurrent])
    ssms = mx.concatenate([as_dtype(r.ssm, mx.float32).reshape(-1) for r in recurrent])
    return convs, ssms


def _tape_rows(shapes: Shapes, gstate: mx.array, start: int, rows: int) -> TapeRows:
    """A layer's tape rows as the step wrote them into `gstate` from float `start` on:
    (conv_in, q, k, v, g, beta)."""
    g = shapes.linear
    assert g is not None
    nv, dk, dv = g.value_heads, g.key_dim, g.value_dim
    tape = gstate[start : start + rows * g.tape_row()].reshape(rows, g.tape_row())
    pieces, at = {}, 0
    for name, width in fused_step_layers.tape_layout(shapes):
        pieces[name] = tape[:, at : at + width]
        at += width
    return (
        pieces["conv_in"],
        pieces["q"].reshape(rows, nv, dk),
        pieces["k"].reshape(rows, nv, dk),
        pieces["v"].reshape(rows, nv, dv),
        pieces["g"],
        pieces["beta"],
    )


def adopt(
    shapes: Shapes, recurrent: list[RecurrentState], gstate: mx.array, gconv: mx.array,
    rows: int, end: int,
) -> Stacks:  # fmt: skip
    """The step's new states into the layers (length `end`), and its rows into the tapes
    that are recording; the stacks the next launch may read as they are."""
    g = shapes.linear
    assert g is not None
    nv, dk, dv = g.value_heads, g.key_dim, g.value_dim
    per_state = nv * dk * dv
    states = fused_step_layers.state_floats(shapes)
    tape_row = g.tape_row()
    n = len(recurrent)  # each layer's views: two splits, not a slice and a reshape each
    ssms = mx.split(gstate[: n * per_state].reshape(n * nv, dk, dv), n)
    convs = mx.split(gconv.reshape(n * (g.conv_kernel - 1), g.conv_channels), n)
    for j, layer in enumerate(recurrent):
        layer.ssm, layer.conv = ssms[j], convs[j]
        layer.length = end
        if layer.tape is not None:  # sliced out only if a replay reads them
            start = states + j * rows * tape_row
            layer.record_later(rows, partial(_tape_rows, shapes, gstate, start, rows))
    return Stacks(gconv, gstate, tuple(r.conv for r in recurrent), tuple(r.ssm for r in recurrent))
