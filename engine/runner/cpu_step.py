"""Decode and verify steps on the NumPy backend as one C call (kernels/csrc/step.c).

A step of the default model on the per-op path makes a few hundred NumPy calls between
its matmuls (norms, rope, splits, the KV append, activations): ~2-3 ms of a ~16 ms step.
`CpuStep` hands the whole forward of up to MAX_ROWS rows to C instead: the embedding
rows are looked up here, every layer and the LM head run in C, and the KV state objects
keep owning their buffers: a full-attention layer's rows are written in place past its
cursor (its buffer grown first, as `FullKV.append` would), a sliding ring's rows come
back as the forward's pending rows (`SlidingKV.append`), and the cursors move as the
appends would have moved them. `begin_forward` / `end_forward` / `abort_forward` frame
the call as they frame the model's own forward, so rollback and undo are unchanged.

Every row is computed alone in a fixed order, whatever the row count and thread count:
a verify equals single steps bit for bit. `unsupported_reason` names what the plan does
not compute (the hybrid's Gated DeltaNet layers, gated attention, other weight types);
such models keep the per-op path. Where every matmul is row-invariant too (int8 and dense
weights: `rows_invariant`), prefill goes through the C step in pieces of MAX_ROWS
(`ModelRunner.prefill_chunk`), so a prompt's rows are the same bits however it is chunked,
decoded or verified: int8 activations would turn the per-op path's other roundings into
a different quantization step (~0.5 on a logit), and rollback would no longer equal a
fresh prefill.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.models.base import (
    FULL,
    SLIDING,
    AttentionBlock,
    DecoderLayer,
    DecoderModel,
    ModelConfig,
)
from engine.models.gemma3 import Gemma3DecoderLayer
from engine.models.rope import Rope
from engine.sequence import SequenceState
from engine.state import FullKV, SlidingKV
from kernels import qmatmul
from kernels.int8_matmul import Int8Matrix
from kernels.qmatmul import ATTENTION_MAX_DIM, QMatrix
from kernels.row_parts import RowParts

MAX_ROWS = 64  # STEP_MAX_ROWS in kernels/csrc/step.h; the C attention takes <= 64 rows alike
F32 = np.float32
KV_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # what the C step reads and writes
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


def extension() -> Any:
    ext = qmatmul._ext
    return ext if ext is not None and hasattr(ext, "step_run") else None


def weight_reason(w: Any) -> str | None:
    if isinstance(w, QMatrix | Int8Matrix):
        return None
    if isinstance(w, RowParts):
        return next((r for r in map(weight_reason, w.parts) if r), None)
    if isinstance(w, np.ndarray) and w.dtype == F32 and w.ndim == 2 and w.flags.c_contiguous:
        return None
    return f"weights of type {type(w).__name__}"


def _row_invariant(w: Any) -> bool:
    """Whether the C step's product with `w` gives a row the same bits whatever the row
    count: int8 and dense do; the float kernel's 4/8-bit tiles split 1- and 3-row sums."""
    if isinstance(w, RowParts):
        return all(map(_row_invariant, w.parts))
    return isinstance(w, Int8Matrix | np.ndarray)


def _linears(model: DecoderModel) -> list[Any]:
    weights = [model.lm_head]
    for layer in model.layers:
        attn, mlp = layer.mixer, layer.mlp
        weights += [attn.qkv.w, attn.o.w, mlp.gate_up.w, mlp.down.w]
    return weights


def config_reason(cfg: ModelConfig) -> str | None:
    """What in `cfg` the C step does not compute, or None (known before any weight is read,
    so the loader can pick the matmul that keeps rows exact: engine/loader.py)."""
    kinds = {cfg.layer_type(i) for i in range(cfg.num_layers)}
    if kinds - {FULL, SLIDING}:
        return f"{', '.join(sorted(kinds - {FULL, SLIDING}))} layers are not in the C step"
    if cfg.attn_output_gate:
        return "gated attention output is not in the C step"
    if cfg.head_dim > ATTENTION_MAX_DIM:
        return f"head dim {cfg.head_dim} over {ATTENTION_MAX_DIM}"
    return None


def ops_reason(ops: Any) -> str | None:
    """Why the C step cannot run on `ops` (its backend, the kernel's build), or None."""
    if ops.name != "numpy":
        return "needs the NumPy backend"
    if extension() is None:
        return "the C kernel (kernels._qmatmul) is not built"
    if not getattr(ops, "packed", False):
        return "the C kernel is switched off (qmatmul=False)"
    return None


def unsupported_reason(model: DecoderModel) -> str | None:
    """Why `model` cannot take the C step (its calls then keep the per-op path), or None."""
    reason = ops_reason(model.ops) or config_reason(model.config)
    if reason is not None:
        return reason
    for layer in model.layers:
        if type(layer) not in (DecoderLayer, Gemma3DecoderLayer):
            return f"layer class {type(layer).__name__} is not in the C step"
        if type(layer.mixer) is not AttentionBlock:
            return f"mixer {type(layer.mixer).__name__} is not in the C step"
    return next((r for r in map(weight_reason, _linears(model)) if r), None)


def weight_parts(w: Any) -> tuple[tuple[Any, ...], ...]:
    """A weight as step_plan takes it: its column blocks, packed or dense [k, cols]."""
    if isinstance(w, Int8Matrix):
        return (("i", w),)
    if isinstance(w, QMatrix):
        return (("q", w.packed, w.scales, w.biases, w.group_size, w.bits),)
    if isinstance(w, RowParts):
        return tuple(spec for part in w.parts for spec in weight_parts(part))
    return (("f", w),)


class CpuStep:
    """One model's C plan and the calls through it (the model's forward for 1..MAX_ROWS
    rows); `num_steps` counts the calls it served."""

    max_rows = MAX_ROWS

    def __init__(self, model: DecoderModel) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the C decode step cannot run this model: {reason}")
        self.model = model
        cfg = model.config
        self.ropes: list[Rope] = []  # distinct ropes (Gemma: local and global), by identity
        for layer in model.layers:
            if not any(layer.mixer.rope is r for r in self.ropes):
                self.ropes.append(layer.mixer.rope)
        self.kinds = tuple(
            FullKV if cfg.layer_type(i) == FULL else SlidingKV for i in range(cfg.num_layers)
        )
        sizes = (
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.vocab_size,
        )
        ropes = tuple((r.dims, int(r.traditional), float(r.mscale)) for r in self.ropes)
        layers = tuple(self._layer_spec(i, layer) for i, layer in enumerate(model.layers))
        self.plan = extension().step_plan(
            sizes,
            float(cfg.rms_norm_eps),
            ACTIVATIONS[cfg.hidden_act],
            ropes,
            model.norm,
            weight_parts(model.lm_head),
            layers,
        )
        self._run = extension().step_run  # an attribute: tests break a step mid-way
        self.rows_invariant = all(map(_row_invariant, _linears(model)))
        self.num_steps = 0

    def _layer_spec(self, i: int, layer: Any) -> tuple[Any, ...]:
        attn, cfg = layer.mixer, self.model.config
        sandwich = isinstance(layer, Gemma3DecoderLayer)
        rope = next(j for j, r in enumerate(self.ropes) if r is attn.rope)
        return (
            layer.input_norm,
            layer.post_norm,
            layer.pre_ffw_norm if sandwich else None,
            layer.post_ffw_norm if sandwich else None,
            weight_parts(attn.qkv.w),
            attn.qkv_bias,
            attn.q_norm,
            attn.k_norm,
            weight_parts(attn.o.w),
            weight_parts(layer.mlp.gate_up.w),
            weight_parts(layer.mlp.down.w),
            rope,
            cfg.sliding_window if cfg.layer_type(i) == SLIDING else 0,
            float(attn.scale),
        )

    def supports(self, state: SequenceState, num_rows: int) -> bool:
        """Whether a call of `num_rows` on `state` runs here: decode-sized rows on the
        KV kinds the plan was built for, in float32 or float16."""
        if not 1 <= num_rows <= MAX_ROWS or len(state.layers) != len(self.kinds):
            return False
        for kind, layer in zip(self.kinds, state.layers, strict=True):
            if type(layer) is not kind:
                return False
            keys = layer.keys
            if keys is not None and (
                keys.dtype not in KV_DTYPES or layer.values.dtype != keys.dtype
            ):
                return False
        return True

    def __call__(self, token_ids: list[int], state: SequenceState, logits: str = "last") -> Any:
        """Append `token_ids` to `state`; logits for "all" rows, the "last" row, or "none"."""
        return self.forward_hidden(token_ids, state, logits)[0]

    def forward_hidden(
        self,
        token_ids: list[int],
        state: SequenceState,
        logits: str = "last",
        taps: tuple[int, ...] = (),
    ) -> tuple[Any, np.ndarray]:
        """The call, and the last layer's output rows [L, D]: the residual stream the C
        step leaves in place; with `taps`, those layers' outputs side by side, copied out
        by the step as it passes them [L, len(taps) * D]."""
        num_rows = len(token_ids)
        if not self.supports(state, num_rows):
            raise ValueError(f"the C decode step does not take {num_rows} rows on this state")
        model, cfg = self.model, self.model.config
        offset = state.begin_forward(num_rows)
        try:
            end = offset + num_rows
            x = model.ops.embed(model.embed, np.asarray(token_ids, dtype=np.int64))
            if cfg.embed_scale != 1.0:
                x = x * cfg.embed_scale
            x = np.ascontiguousarray(x, dtype=F32)  # [L, D], the C step's residual stream
            tables = tuple(self._rope_table(rope, end) for rope in self.ropes)
            kv = tuple(self._kv_argument(layer, end, num_rows) for layer in state.layers)
            out = None
            if logits != "none":
                out = np.empty((num_rows if logits == "all" else 1, cfg.vocab_size), dtype=F32)
            tapped = None
            if taps:
                tapped = np.empty((num_rows, len(taps) * cfg.hidden_size), dtype=F32)
                self._run(self.plan, x, offset, kv, tables, out, (tuple(taps), tapped))
            else:
                self._run(self.plan, x, offset, kv, tables, out)
            for layer, arg in zip(state.layers, kv, strict=True):
                if isinstance(layer, SlidingKV):  # written into the ring at end_forward
                    layer._pending = (offset, arg[3], arg[4])
                layer.length = end
            state.end_forward(list(token_ids))
        except BaseException:  # as the model's forward: undo, then report it
            state.abort_forward()
            raise
        self.num_steps += 1
        return out, (x if tapped is None else tapped)

    def _rope_table(self, rope: Rope, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The NumPy backend's own cos/sin tables, so both paths rotate by equal factors."""
        if rope.max_positions and end > rope.max_positions:
            raise ValueError(
                f"rope_type 'dynamic' past {rope.max_positions} positions recomputes every "
                "earlier position's rotation, which cached keys cannot follow; refused"
            )
        ops: Any = self.model.ops
        return ops._rope_table(rope.dims, rope.theta, end, rope.inv_freq)

    def _kv_argument(self, layer: Any, end: int, num_rows: int) -> tuple[Any, ...]:
        if isinstance(layer, FullKV):
            layer._make_room(end)  # grown exactly as FullKV.append grows it
            return (layer.keys, layer.values)
        H, _, D = layer.keys.shape  # the forward's rows, in the ring's dtype
        new_k = np.empty((H, num_rows, D), dtype=layer.keys.dtype)
        new_v = np.empty((H, num_rows, D), dtype=layer.keys.dtype)
        return (layer.keys, layer.values, layer.positions, new_k, new_v)
