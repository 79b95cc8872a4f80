"""Decode steps queued ahead: the next one-row step goes to the device before the host
has read the token it takes, so the host's part of a step (building the launch, reading
the token back, streaming it) overlaps the device's computing the step before.

On a GPU a plain decode step of a small model is bound by that host work and the
launch's latency, not by arithmetic: on the H200 the default model's one-launch kernel
runs ~0.66 ms of a ~1.15 ms step (docs/BENCHMARKS.md, "How a decode step runs on the
GPU"). mlx-lm's `generate_step` overlaps the same way with `mx.async_eval`; here the
next step's input is the last step's argmax (or draw) as it lies on the device.

A `Launch` is one queued step: the state has begun its forward, and its `top` is lazy:
the argmax of its logits [1], or for a sampled reply the device's draw of the token,
which the host checks against its own draw from the logits. Its input token is recorded
(`end`) once the host knows it, one step later; a step whose input ended the reply, or
was not the host's draw, is `cancel`led, undone as the state undoes a forward that
raised. A queued step computes the values the synchronous one does: the same graph, or
the same kernel launch, evaluated later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from engine.errors import StateError
from engine.sequence import SequenceState


class StepTimedOut(RuntimeError):
    """A queued one-launch step's grid barrier timed out: its rows are not the model's."""


@dataclass(frozen=True)
class Kept:
    """What a sampled step keeps for the host's draw, evaluated with the step: its logits
    row [V] float32, and the device draw's pack (engine/sampling_candidates.py) or None."""

    row: mx.array | None = None
    packed: mx.array | None = None


@dataclass
class Launch:
    state: SequenceState
    top: mx.array  # [1]: the next step's input, lazy: the argmax, or the device's draw
    status: mx.array | None = None  # the one-launch kernel's: nonzero if a barrier timed out
    kept: Kept = Kept()  # where the host draws
    # the rows a drafter reads (`forward_hidden`'s), evaluated with the step, where asked
    hidden: mx.array | None = None
    is_ended: bool = False
    is_checked: bool = False  # the step's status read and found good

    def end(self, token: int) -> None:
        """The step's input is `token` (read from the step before): record its row."""
        self.state.end_forward([token])
        self.is_ended = True

    def read(self) -> int:
        """`top` once the device has it; StepTimedOut where the kernel failed (the step
        may already be ended: the caller takes its row back)."""
        self._check()
        return int(np.asarray(self.top)[0])

    def read_row(self) -> np.ndarray:
        """The step's logits on the host [V], float32 (a launch that kept them). The row
        was evaluated with the step: reading it waits for that step alone, where a slice
        or cast taken now would queue behind the step launched after it."""
        if self.kept.row is None:
            raise ValueError("this launch kept only its argmax")
        self._check()
        return np.asarray(self.kept.row)

    def read_pack(self) -> np.ndarray | None:
        """The device draw's pack on the host, or None (a launch that kept none)."""
        if self.kept.packed is None:
            return None
        self._check()
        return np.asarray(self.kept.packed)

    def _check(self) -> None:
        """Wait for the step; StepTimedOut where its kernel failed. A sampled step is read
        twice (its token, then its pack): the second read has nothing to wait for."""
        if self.status is not None and not self.is_checked:
            mx.eval(self.top, self.status)
            if self.status.item():
                raise StepTimedOut("the one-launch step timed out at a grid barrier")
            self.is_checked = True

    def cancel(self) -> None:
        """Take back a step that was not ended: its input is not part of the reply."""
        if not self.is_ended and not self.state.abort_forward():
            raise StateError("a queued step could not be undone; reset the state")


@dataclass(frozen=True)
class DeviceDraw:
    """A sampled step's work on the device from its last logits row [V] float32: the next
    step's token [1], and where the host's draw can read less than the row, what it reads
    (a pack, engine/device_sampling.py), else None; both lazy."""

    run: Callable[[mx.array], tuple[mx.array, mx.array | None]]

    def __call__(self, row: mx.array) -> tuple[mx.array, mx.array | None]:
        """(the next step's token, the pack or None), not evaluated."""
        return self.run(row)


# Which layers' rows a queued step hands out: None, none; () the last; else those layers'
Taps = tuple[int, ...] | None


def queue(logits: mx.array, draw: DeviceDraw | None) -> tuple[mx.array, Kept]:
    """(the next step's input, what the host's draw reads): the argmax; or `draw`'s token
    with the last logits row [V] in float32 and the draw's pack kept for the host's own
    draw; all evaluated with the step."""
    if draw is None:
        top = mx.argmax(logits, axis=-1)
        mx.async_eval(top)
        return top, Kept()
    # a view of the last row (an int index is a gather, its index an array the host writes)
    row = logits[-1:].reshape(-1)
    row = row if row.dtype == mx.float32 else row.astype(mx.float32)
    top, packed = draw(row)
    mx.async_eval(*(a for a in (top, row, packed) if a is not None))
    return top, Kept(row, packed)


def launch_model(
    model: Any, ids: Any, state: SequenceState, draw: DeviceDraw | None = None, taps: Taps = None
) -> Launch:
    """One row through the model's own forward (the MLX backend), queued: `ids` [1] a host
    token or the step before's `top`, not yet read; with `taps`, the rows `forward_hidden`
    gives."""
    if not isinstance(ids, mx.array):
        ids = np.asarray(ids, dtype=np.int64)
    offset = state.begin_forward(1)
    tapped: list[mx.array] = []
    try:
        x = model.hidden(ids, state.layers, offset, taps or (), tapped.append)
        top, kept = queue(model.logits(x[-1:]), draw)
        hidden = None
        if taps is not None:
            hidden = mx.concatenate(tapped, axis=-1) if taps else x
            mx.async_eval(hidden)
    except BaseException:
        state.abort_forward()
        raise
    return Launch(state, top, kept=kept, hidden=hidden)
