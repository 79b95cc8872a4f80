"""One-token decode through a single compiled MLX graph.

On a GPU a naive decode step is bound by building and launching ~15 small kernels
per layer, not by arithmetic (~4 ms per token for the default model on an H200).
`mx.compile` traces the whole step once and replays it: the KV buffers and recurrent
states go in and come out as arrays, the position is an array (`slice_update` and
`fast.rope` take array offsets), and attention runs over the whole preallocated
buffer with a mask, so shapes only change when a buffer grows (in large steps).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from engine.sequence import SequenceState
from engine.state import FullKV, RecurrentState

_CAPACITY_STEP = 1024  # grow KV buffers in large steps: each new shape is a retrace


class _TracedKV:
    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array) -> None:
        self.keys, self.values, self.offset = keys, values, offset

    def append(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        self.keys = mx.slice_update(self.keys, k, self.offset, axes=(1,))
        self.values = mx.slice_update(self.values, v, self.offset, axes=(1,))
        mask = mx.arange(self.keys.shape[1])[None, :] <= self.offset
        return self.keys, self.values, mask


class _TracedRecurrent:
    tape = None

    def __init__(self, conv: mx.array, ssm: mx.array) -> None:
        self.conv, self.ssm, self.length = conv, ssm, 0

    def record(self, *rows: Any) -> None:
        return None


class CompiledDecode:
    def __init__(self, model: Any) -> None:
        self.model = model
        self._step = mx.compile(self._trace)

    def supports(self, state: SequenceState) -> bool:
        recording = any(
            isinstance(layer, RecurrentState) and layer.tape is not None for layer in state.layers
        )
        kinds_ok = all(isinstance(layer, FullKV | RecurrentState) for layer in state.layers)
        return kinds_ok and not recording

    def _trace(self, token: mx.array, offset: mx.array, *buffers: mx.array) -> list[mx.array]:
        proxies: list[Any] = []
        it = iter(buffers)
        for layer in self.model.layers:
            a, b = next(it), next(it)
            is_recurrent = layer.mixer.__class__.__name__ != "AttentionBlock"
            proxies.append(_TracedRecurrent(a, b) if is_recurrent else _TracedKV(a, b, offset))
        h = self.model.hidden(token, proxies, offset)
        out = [self.model.logits(h)]
        for p in proxies:
            out += [p.conv, p.ssm] if isinstance(p, _TracedRecurrent) else [p.keys, p.values]
        return out

    def __call__(self, token_id: int, state: SequenceState) -> mx.array:
        position = state.begin_forward(1)
        buffers: list[mx.array] = []
        for layer in state.layers:
            if isinstance(layer, FullKV):
                if layer.capacity() <= position:
                    layer._grow(-(-(position + 1) // _CAPACITY_STEP) * _CAPACITY_STEP)
                buffers += [layer.keys, layer.values]
            else:
                assert isinstance(layer, RecurrentState)
                buffers += [layer.conv, layer.ssm]
        outputs = self._step(mx.array([token_id]), mx.array([position]), *buffers)
        logits, rest = outputs[0], outputs[1:]
        for i, layer in enumerate(state.layers):
            a, b = rest[2 * i], rest[2 * i + 1]
            if isinstance(layer, FullKV):
                layer.keys, layer.values = a, b
            else:
                assert isinstance(layer, RecurrentState)
                layer.conv, layer.ssm = a, b
            layer.length = position + 1
        mx.eval(logits)
        state.end_forward([token_id])
        return logits
