"""Decode and verify steps through the fused CUDA kernels (full-attention decoders; hybrids
and sliding-window models such as Gemma 3 in the one-launch step, a hybrid's linear layers
fed by engine/runner/fused_hybrid.py).

Two paths, both computing every row independently of how many there are:
`kernels.fused_step_cuda` (the default on CUDA) runs a whole step in one kernel launch,
reading every weight as stored (one table of the quantized words and their float32
scales: kernels/step_weights.py); `kernels.fused_decode_cuda` does a layer in five
kernels (instead of ~20 MLX ops), eager or traced once with `mx.compile`, on weights
dequantized once into the model dtype, and has an MLX-ops reference that runs anywhere.
This module feeds them, the KV rows written into the sequence state's own `FullKV`
buffers and `SlidingKV` rings (so checkpoints, rollback and prefill work unchanged; a
ring's hooks around the launch keep its positions and a recording verify's tape).

Used for calls of 1..MAX_ROWS tokens (decode, verify, short re-prefills); longer
prefills take the ordinary path. Row invariance makes greedy speculation exact:
a verify's logits equal, bit for bit, those of one-token steps over the same rows.
"""

from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx

from engine.kv_state import reserve_alike
from engine.models.base import DecoderModel
from engine.runner import fused_hybrid
from engine.runner.ahead import DeviceDraw, Launch, Taps, queue
from engine.runner.fused_layers import FiveKernelSteps
from engine.runner.fused_support import (
    MAX_DENSE_BYTES,
    dense_bytes,
    model_shapes,
    rope_table,
    rope_tables,
    step_norms,
    step_unsupported_reason,
    unsupported_reason,
)
from engine.sequence import SequenceState
from engine.state import FullKV, RecurrentState, SlidingKV
from kernels import fused_decode_cuda, step_weights
from kernels.fused_decode_cuda import MAX_ROWS
from kernels.fused_step_cuda import hidden_offset

__all__ = [
    "MAX_DENSE_BYTES",
    "FusedDecode",
    "dense_bytes",
    "rope_table",
    "rope_tables",
    "step_unsupported_reason",
    "unsupported_reason",
]

_CAPACITY_STEP = 1024  # compiled steps retrace per buffer shape: grow in large steps

log = logging.getLogger(__name__)


class FusedDecode(FiveKernelSteps):
    """mode "step": one kernel launch per step (kernels/fused_step_cuda.py, CUDA only);
    mode "layers": five kernels a layer, eager or traced once with `mx.compile`;
    mode None: "step" where the one-launch kernel runs, else "layers"."""

    def __init__(
        self,
        model: DecoderModel,
        kernels: Any = None,
        compiled: bool = True,
        mode: str | None = None,
        step_tuning: dict[str, int] | None = None,
    ) -> None:
        if mode is None:
            one_launch = fused_decode_cuda.is_available() and not step_unsupported_reason(model)
            mode = "step" if one_launch else "layers"
        if mode not in ("step", "layers"):
            raise ValueError(f"fused decode mode must be 'step' or 'layers', not {mode!r}")
        if reason := unsupported_reason(model, step=mode == "step"):
            raise ValueError(f"fused decode: {reason}")
        # the MLX backend (unsupported_reason checked): its dequantize, and embed of device ids
        ops: Any = model.ops
        self.model, self.ops = model, ops
        shapes = model_shapes(model)
        self.k: Any = kernels or (None if shapes.linear else fused_decode_cuda.kernels_for(shapes))
        # a hybrid's linear layers: their conv weights and vectors (engine/runner/fused_hybrid.py)
        self.linear_params = fused_hybrid.params(model) if shapes.linear else None
        self.stacks: fused_hybrid.Stacks | None = None  # the last launch's, for the next
        layers = model.layers
        self.tied = model.lm_head is model.embed
        self.embed = model.embed
        self.step_kernel: Any = None
        self.stacked: list[mx.array] = []  # the five kernels' dense copy, made when used
        if mode == "step":
            from kernels.fused_step_cuda import StepKernel, check_tuning, tuning_for

            if reason := step_unsupported_reason(model):
                raise ValueError(f"fused step: unsupported {reason}")
            self.weights = step_weights.build_for(model, check_tuning(step_tuning or {}))
            self.norms = step_norms(model, shapes)
            tuning = tuning_for(
                self.weights.layer_bytes, shapes.qk_norm, hybrid=shapes.linear is not None
            ) | (step_tuning or {})
            if tuning.get("FQ_WIDE"):
                step_weights.check_wide(self.weights)
            self.step_kernel = StepKernel.for_table(shapes, len(layers), self.weights, tuning)
        else:
            self._dense_copy()
        self.mode = mode
        self.compiled = compiled
        self._traced: dict[tuple[str, tuple[int, ...]], Any] = {}
        self.shapes = shapes
        self.keep_hidden = False  # set around `forward_hidden`: the rows cost a copy
        self.taps: tuple[int, ...] = ()  # and the layers whose rows it keeps (): the last
        self.hidden: mx.array | None = None  # the latest step's kept rows
        if mode == "step":
            self._warm_up()

    def _warm_up(self) -> None:
        """Compile the step kernel's builds now (NVRTC takes ~1-15 s each): decode's, and
        a verify's for its logits modes, at load, not in the middle of someone's first
        edit."""
        state = self.model.new_state()
        self([0], state, "none")
        self([0], state, "last")
        self([0, 0], state, "all")
        self([0, 0], state, "last")

    def row_limit(self, sliding_slack: int) -> int:
        """The most rows a call takes with rings of this slack (a sliding layer's rows
        must not overwrite a key their own queries read: `SlidingKV.before_kernel_write`)."""
        return max(1, min(MAX_ROWS, sliding_slack)) if self.shapes.sliding else MAX_ROWS

    def forward_hidden(
        self, token_ids: list[int], state: SequenceState, logits: str, taps: tuple[int, ...] = ()
    ) -> tuple[Any, mx.array]:
        """The step, and its last-layer rows [rows, D] in float32 (with `taps`, those
        layers' rows side by side: the five kernels only, see ModelRunner.tap_problem)."""
        if taps and self.step_kernel is not None:
            raise ValueError("the one-launch step hands out the last layer's rows alone")
        self.keep_hidden, self.taps = True, tuple(taps)
        try:
            out = self(token_ids, state, logits)
        finally:
            self.keep_hidden, self.taps = False, ()
        hidden, self.hidden = self.hidden, None
        assert hidden is not None
        return out, hidden

    def supports(self, state: SequenceState, rows: int) -> bool:
        split = self._split(state)
        if not 1 <= rows <= MAX_ROWS or split is None:
            return False
        rings = [kv for kv in split[0] if isinstance(kv, SlidingKV)]
        # the kernel reads one ring size; its rows overwrite none a query of theirs needs
        return len({ring.size for ring in rings}) <= 1 and all(rows <= r.slack for r in rings)

    def _split(
        self, state: SequenceState
    ) -> tuple[list[FullKV | SlidingKV], list[RecurrentState]] | None:
        """The attention layers' KV (rings where the step computes sliding layers) and a
        hybrid's linear layers' states, if the path takes every layer as it is."""
        split = fused_hybrid.split_layers(state.layers)
        if split is None or bool(split[1]) != (self.linear_params is not None):
            return None
        if self.step_kernel is None and any(isinstance(kv, SlidingKV) for kv in split[0]):
            return None  # the five kernels attend to whole caches only
        return split

    # -- one step ----------------------------------------------------------------------
    def __call__(self, token_ids: list[int], state: SequenceState, logits: str) -> Any:
        split = self._split(state)
        if split is None:  # checked before the state changes (callers ask `supports` first)
            raise ValueError("the fused path needs the model's own layer states")
        offset = state.begin_forward(len(token_ids))
        try:
            ids = mx.array(token_ids, dtype=mx.int32)
            pos = mx.array([offset], dtype=mx.int32)
            out, status = self._queue(ids, pos, logits, *split, offset)
            out = self._settle(out, status, ids, pos, logits, split[0], offset)
            state.end_forward(list(token_ids))
            return out
        except BaseException:
            # The step kernels write new rows past the cursor, the eager step writes new
            # arrays: the cursor undoes both. A traced step donated the old buffers: the
            # state stays poisoned.
            if not self.compiled or self.step_kernel is not None:
                state.abort_forward()
            raise

    def can_launch(self, state: SequenceState, taps: Taps = None) -> bool:
        """Whether `launch` takes a row of `state`: a step the state can undo (a traced
        step donates its buffers), keeping the rows `taps` names where they can be had
        (ModelRunner.tap_problem)."""
        undoable = self.step_kernel is not None or not self.compiled
        if taps and self.step_kernel is not None:
            return False
        return undoable and not self.keep_hidden and self.supports(state, 1)

    def launch(
        self, ids: mx.array, state: SequenceState, draw: DeviceDraw | None = None, taps: Taps = None
    ) -> Launch:
        """One row queued on the device (engine/runner/ahead.py): its input `ids` [1] as
        they are (the step before's `top`, not yet read), its own `top` lazy; where `taps`
        is not None, the rows `forward_hidden` would give."""
        split = self._split(state)
        if split is None or not self.can_launch(state, taps):
            raise ValueError("this state's step cannot be queued ahead")
        offset = state.begin_forward(1)
        self.keep_hidden, self.taps = taps is not None, tuple(taps or ())
        try:
            pos = mx.array([offset], dtype=mx.int32)
            out, status = self._queue(ids.astype(mx.int32), pos, "last", *split, offset)
            hidden = self._kept_rows(status, 1) if taps is not None else None
            top, kept = queue(out, draw)
            # the kept rows are copied before the next launch may overwrite the scratch
            mx.async_eval(*(a for a in (status, hidden) if a is not None))
        except BaseException:
            state.abort_forward()
            raise
        finally:
            self.keep_hidden, self.taps = False, ()
        return Launch(state, top, status, kept, hidden)

    def _kept_rows(self, status: mx.array | None, rows: int) -> mx.array:
        """The step's kept rows (`keep_hidden`): the five kernels' as they set them, the
        one-launch kernel's copied out of its scratch, which the next launch overwrites."""
        if status is None:
            hidden, self.hidden = self.hidden, None
            assert hidden is not None
            return hidden
        start, D = hidden_offset(self.shapes), self.shapes.hidden
        return self.step_kernel._scratch[start : start + rows * D].reshape(rows, D) + 0.0

    def _queue(
        self,
        ids: mx.array,
        pos: mx.array,
        logits: str,
        kvs: list[FullKV | SlidingKV],
        recurrent: list[RecurrentState],
        offset: int,
    ) -> tuple[Any, mx.array | None]:
        """A call's step put together, not evaluated: (logits or None, the one-launch
        kernel's status or None); the caches' cursors and a hybrid's states moved on."""
        rows = int(ids.shape[0])
        need = offset + rows
        caches = [kv for kv in kvs if isinstance(kv, FullKV)]
        rings = [kv for kv in kvs if isinstance(kv, SlidingKV)]
        reserve_alike(caches, need, _CAPACITY_STEP)
        status = None
        if self.step_kernel is not None:
            for ring in rings:  # the kernel writes the rows into their slots in place
                ring.before_kernel_write(offset, rows)
            out, status = self._one_launch(ids, pos, kvs, logits, offset, recurrent)
            for ring in rings:
                ring.after_kernel_write(offset, rows)
        elif self.compiled:
            out = self._compiled_step(ids, pos, caches, logits)
        else:
            out = self._eager_step(ids, pos, caches, logits, offset)
        for kv in caches:
            kv.replace_buffers(kv.keys, kv.values, need)
        return out, status

    def _settle(
        self,
        out: Any,
        status: mx.array | None,
        ids: mx.array,
        pos: mx.array,
        logits: str,
        kvs: list[FullKV | SlidingKV],
        offset: int,
    ) -> Any:
        """Evaluate a call `_queue` put together: its logits (with a greedy read's
        argmax), the rows it keeps, and a timed-out one-launch step redone kernel by
        kernel."""
        top = mx.argmax(out, axis=-1) if out is not None and status is not None else None
        pending = [a for kv in kvs for a in (kv.keys, kv.values)] if out is None else [out]
        mx.eval(*pending, *(a for a in (status, top) if a is not None))
        if status is not None and status.item():
            # A barrier timed out: not every block was resident (a smaller or shared GPU).
            # The rows it wrote lie past the state's length; redo the step kernel by kernel.
            self.fall_back()
            caches = [kv for kv in kvs if isinstance(kv, FullKV)]  # every one (no rings)
            out = self._eager_step(ids, pos, caches, logits, offset)
            for kv in caches:
                kv.replace_buffers(kv.keys, kv.values, offset + int(ids.shape[0]))
            mx.eval(out if out is not None else [a for kv in caches for a in (kv.keys, kv.values)])
            return out
        if status is not None and self.keep_hidden:
            self.hidden = self._kept_rows(status, int(ids.shape[0]))
            mx.eval(self.hidden)
        if top is not None:  # a greedy read's argmax, evaluated in the launch's evaluation
            self.ops.remember_argmax(out, top)
        return out

    def fall_back(self) -> None:
        """From the one-launch step to the five kernels (its barrier timed out: not every
        block was resident); RuntimeError where they cannot take this model."""
        reason = unsupported_reason(self.model)
        if reason:  # the five kernels would compute another model
            raise RuntimeError(
                f"fused one-launch step timed out at a grid barrier (not every block was "
                f"resident) and the five kernels cannot take this model: {reason}"
            )
        log.warning("fused one-launch step timed out at a grid barrier; using 5 kernels")
        self.step_kernel = None
        self.mode = "layers"
        self._dense_copy()

    def _one_launch(
        self,
        ids: mx.array,
        pos: mx.array,
        kvs: list[FullKV | SlidingKV],
        logits: str,
        offset: int,
        recurrent: list[RecurrentState],
    ) -> tuple[Any, mx.array]:
        """(logits or None, status [1]: nonzero if a barrier timed out), not evaluated."""
        head_mode = {"none": 0, "last": 1, "all": 2}[logits]
        linear = None
        if recurrent:
            stacks = fused_hybrid.linear_inputs(recurrent, self.stacks)
            linear = (self.linear_params, *stacks)
        outs = self.step_kernel.launch(
            ids,
            pos,
            self.weights,
            self.norms,
            [kv.keys for kv in kvs],
            [kv.values for kv in kvs],
            head_mode,
            linear=linear,
        )
        if recurrent:  # the linear layers' new states, and their rows into recording tapes
            rows = int(ids.shape[0])
            self.stacks = fused_hybrid.adopt(
                self.shapes, recurrent, outs[3], outs[4], rows, offset + rows
            )
        return (outs[0] if logits != "none" else None), outs[2]
