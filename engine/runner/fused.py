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

from engine.models.base import DecoderModel
from engine.runner import fused_hybrid
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


class FusedDecode:
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

    def _dense_copy(self) -> None:
        """The five kernels' weights: stacked [num_layers, ...] in the model dtype."""
        ops = self.ops

        def dense(w: Any) -> mx.array:
            return ops._dense(w).astype(ops.dtype)

        def f32(w: Any) -> mx.array:
            return w.astype(mx.float32)

        model, layers = self.model, self.model.layers
        self.stacked = [
            mx.stack([f32(layer.input_norm) for layer in layers]),
            mx.stack([dense(layer.mixer.qkv.w) for layer in layers]),
            mx.stack([dense(layer.mixer.o.w) for layer in layers]),
            mx.stack([f32(layer.post_norm) for layer in layers]),
            mx.stack([dense(layer.mlp.gate_up.w) for layer in layers]),
            mx.stack([dense(layer.mlp.down.w) for layer in layers]),
            f32(model.norm),
            dense(model.lm_head),
        ]
        mx.eval(*self.stacked)
        self.norm, self.head_w = self.stacked[6], self.stacked[7]
        self.layers = [tuple(w[i] for w in self.stacked[:6]) for i in range(len(layers))]

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
    def _layers(
        self, x: mx.array, pos: mx.array, caches: list[Any], write: Any, taps: tuple[int, ...] = ()
    ) -> tuple[mx.array, mx.array]:
        """The last layer's rows, and the kept rows: with `taps` those layers' side by
        side, else the last layer's again."""
        k, tapped = self.k, []
        for i, ((nw1, w_qkv, w_o, nw2, w_gu, w_down), cache) in enumerate(
            zip(self.layers, caches, strict=True)
        ):
            q, k_rows, v_rows = k.qkv(x, nw1, w_qkv, pos)
            keys, values = write(cache, k_rows, v_rows)
            h = k.residual(k.attend(q, keys, values, pos), w_o, x)
            x = k.residual(k.gate_up(h, nw2, w_gu), w_down, h)
            if i in taps:
                tapped.append(x)
        return x, (mx.concatenate(tapped, axis=-1) if taps else x)

    def _head(self, x: mx.array, logits: str) -> mx.array | None:
        if logits == "none":
            return None
        return self.k.head(x if logits == "all" else x[-1:], self.norm, self.head_w)

    def _embed(self, ids: mx.array) -> mx.array:
        if self.tied:  # the dense head is the dequantized table: one gather
            return self.head_w[ids].astype(mx.float32)
        return self.ops.embed(self.embed, ids).astype(mx.float32)

    def __call__(self, token_ids: list[int], state: SequenceState, logits: str) -> Any:
        split = self._split(state)
        if split is None:  # checked before the state changes (callers ask `supports` first)
            raise ValueError("the fused path needs the model's own layer states")
        kvs, recurrent = split
        rows = len(token_ids)
        offset = state.begin_forward(rows)
        try:
            return self._forward(token_ids, state, logits, kvs, offset, recurrent)
        except BaseException:
            # The step kernels write new rows past the cursor, the eager step writes new
            # arrays: the cursor undoes both. A traced step donated the old buffers: the
            # state stays poisoned.
            if not self.compiled or self.step_kernel is not None:
                state.abort_forward()
            raise

    def _forward(
        self,
        token_ids: list[int],
        state: SequenceState,
        logits: str,
        kvs: list[FullKV | SlidingKV],
        offset: int,
        recurrent: list[RecurrentState],
    ) -> Any:
        rows = len(token_ids)
        need = offset + rows
        caches = [kv for kv in kvs if isinstance(kv, FullKV)]
        rings = [kv for kv in kvs if isinstance(kv, SlidingKV)]
        # one capacity for every cache: the step kernel strides them all by the first one's
        capacities = {kv.capacity() for kv in caches}
        if any(kv.capacity() < need for kv in caches) or len(capacities) > 1:
            capacity = max(-(-need // _CAPACITY_STEP) * _CAPACITY_STEP, *capacities)
            for kv in caches:
                if kv.capacity() != capacity:
                    kv.reserve(capacity)
        ids = mx.array(token_ids, dtype=mx.int32)
        pos = mx.array([offset], dtype=mx.int32)
        if self.step_kernel is not None:
            for ring in rings:  # the kernel writes the rows into their slots in place
                ring.before_kernel_write(offset, rows)
            out = self._one_launch(ids, pos, kvs, logits, offset, recurrent)
            for ring in rings:
                ring.after_kernel_write(offset, rows)
        elif self.compiled:
            out = self._compiled_step(ids, pos, caches, logits)
        else:
            out = self._eager_step(ids, pos, caches, logits, offset)
        for kv in caches:
            kv.replace_buffers(kv.keys, kv.values, need)
        if out is not None:
            mx.eval(out)
        else:
            mx.eval(*[a for kv in kvs for a in (kv.keys, kv.values)])
        state.end_forward(list(token_ids))
        return out

    def _one_launch(
        self,
        ids: mx.array,
        pos: mx.array,
        kvs: list[FullKV | SlidingKV],
        logits: str,
        offset: int,
        recurrent: list[RecurrentState],
    ) -> Any:
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
        out, status = outs[0], outs[2]
        # a greedy read's argmax, in the launch's evaluation: one wait for the device a step
        top = mx.argmax(out, axis=-1) if logits != "none" else None
        mx.eval(out, status, *([] if top is None else [top]))  # and a hybrid's gstate, gconv
        if self.keep_hidden and not int(status.item()):
            # the kernel leaves the residual rows in its scratch; copied before the next
            # launch overwrites them
            start = hidden_offset(self.shapes)
            D = self.shapes.hidden
            rows = int(ids.shape[0])
            scratch = self.step_kernel._scratch
            self.hidden = scratch[start : start + rows * D].reshape(rows, D) + 0.0
            mx.eval(self.hidden)
        if int(status.item()):
            # A barrier timed out: not every block was resident (a smaller or shared GPU).
            # The rows it wrote lie past the state's length; redo the step kernel by kernel.
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
            caches = [kv for kv in kvs if isinstance(kv, FullKV)]  # every one (no rings)
            return self._eager_step(ids, pos, caches, logits, offset)
        if top is not None:
            self.ops.remember_argmax(out, top)
        if recurrent:  # the linear layers' new states, and their rows into recording tapes
            rows = int(ids.shape[0])
            self.stacks = fused_hybrid.adopt(
                self.shapes, recurrent, outs[3], outs[4], rows, offset + rows
            )
        return out if logits != "none" else None

    def _eager_step(
        self, ids: mx.array, pos: mx.array, kvs: list[FullKV], logits: str, offset: int
    ) -> Any:
        def write(kv: FullKV, k_rows: mx.array, v_rows: mx.array) -> tuple[mx.array, mx.array]:
            keys = self.ops.write_rows(kv.keys, offset, k_rows)
            values = self.ops.write_rows(kv.values, offset, v_rows)
            kv.replace_buffers(keys, values, kv.length)
            return keys, values

        x, kept = self._layers(self._embed(ids), pos, kvs, write, self.taps)
        if self.keep_hidden:
            self.hidden = kept.astype(mx.float32)
        return self._head(x, logits)

    def _compiled_step(self, ids: mx.array, pos: mx.array, kvs: list[FullKV], logits: str) -> Any:
        key = (logits, self.taps)  # a trace's outputs: the rows it keeps
        fn = self._traced.get(key)
        if fn is None:
            fn = self._traced[key] = mx.compile(self._traceable(logits, self.taps))
        buffers = []
        for kv in kvs:
            buffers += [kv.keys, kv.values]
            kv.replace_buffers(None, None, kv.length)  # the step's outputs replace them: donate
        outputs = fn(ids, pos, *buffers)
        del buffers
        rest = outputs[1:] if logits != "none" else outputs
        if self.keep_hidden:
            self.hidden = rest[0].astype(mx.float32)
        rest = rest[1:]
        for i, kv in enumerate(kvs):
            kv.replace_buffers(rest[2 * i], rest[2 * i + 1], kv.length)
        return outputs[0] if logits != "none" else None

    def _traceable(self, logits: str, taps: tuple[int, ...] = ()) -> Any:
        def step(ids: mx.array, pos: mx.array, *buffers: mx.array) -> list[mx.array]:
            caches = [list(buffers[i : i + 2]) for i in range(0, len(buffers), 2)]

            def write(cache: list[Any], k_rows: mx.array, v_rows: mx.array) -> Any:
                cache[0] = mx.slice_update(cache[0], k_rows, pos, axes=(1,))
                cache[1] = mx.slice_update(cache[1], v_rows, pos, axes=(1,))
                return cache[0], cache[1]

            x, kept = self._layers(self._embed(ids), pos, caches, write, taps)
            out = self._head(x, logits)
            flat = [kept, *(a for cache in caches for a in cache)]  # the rows kept
            return flat if out is None else [out, *flat]

        return step
