"""Checks the state tests share: an image of everything observable about a state (for
"a refused or failed call changed nothing"), injected failures, and the stride
snapshots a state must hold after what it went through (test_state_property.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.sequence import SequenceState
from engine.state import SnapshotPolicy
from tests.tolerances import host


@dataclass
class StateImage:
    """Everything observable about a state, copied, for before/after comparisons."""

    tokens: list[int]
    lengths: list[int]
    epoch: int
    is_recording: bool
    snapshot_positions: list[int]
    arrays: list[dict[str, np.ndarray]]


def capture(state: SequenceState) -> StateImage:
    return StateImage(
        tokens=list(state.tokens),
        lengths=[layer.length for layer in state.layers],
        epoch=state.epoch,
        is_recording=state.is_recording,
        snapshot_positions=state.snapshot_positions(),
        arrays=[{k: host(v) for k, v in layer.arrays().items()} for layer in state.layers],
    )


def assert_unchanged(before: StateImage, state: SequenceState) -> None:
    after = capture(state)
    assert after.tokens == before.tokens
    assert after.lengths == before.lengths
    assert after.epoch == before.epoch, "a refused call invalidated checkpoints"
    assert after.is_recording == before.is_recording
    assert after.snapshot_positions == before.snapshot_positions
    for was, now in zip(before.arrays, after.arrays, strict=True):
        assert was.keys() == now.keys()
        for key in was:
            assert np.array_equal(was[key], now[key]), f"layer array {key!r} changed"


class SimulatedOOM(RuntimeError):
    pass


def raise_oom(*args: Any, **kwargs: Any) -> Any:
    raise SimulatedOOM("out of memory (simulated)")


@contextmanager
def broken(target: Any, *names: str) -> Iterator[None]:
    """`target.<name>` raises SimulatedOOM for each name while the block runs."""
    saved = {name: target.__dict__.get(name) for name in names}
    for name in names:
        setattr(target, name, raise_oom)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(target, name)  # the class attribute shows through again
            else:
                setattr(target, name, value)


# Where a forward dies: after the first layer's mixer wrote its rows, after every mixer
# ran (the last layer's MLP), or when the backend evaluates the whole pass.
FORWARD_SITES = ("first mlp", "last mlp", "evaluate")


def forward_site(model: Any, site: str) -> tuple[Any, str]:
    if site == "first mlp":
        return model.layers[0], "mlp"
    if site == "last mlp":
        return model.layers[-1], "mlp"
    return model.ops, "evaluate"


# What a retaining rollback or a commit calls to rebuild states from the tape
REPLAY_OPS = ("gated_delta_recurrent", "conv_state_after", "write_rows", "snapshot")


class ExpectedStrides:
    """The stride snapshots a state must hold: every stride position its committed rows
    passed, the newest `stride_capacity` of them (re-storing one makes it the newest),
    none past a rewind. Equality with the state's stride store is "a truncate replays at
    most `stride` tokens" wherever the store's capacity allows it."""

    def __init__(self, policy: SnapshotPolicy, needs_snapshots: bool) -> None:
        self.stride, self.capacity = policy.stride, policy.stride_capacity
        self.needs_snapshots = needs_snapshots
        self.held: list[int] = []

    def passed(self, start: int, end: int) -> None:
        """Rows start..end were appended and kept."""
        if not (self.needs_snapshots and self.capacity):
            return
        for pos in range((start // self.stride + 1) * self.stride, end + 1, self.stride):
            if pos in self.held:
                self.held.remove(pos)
            self.held.append(pos)
        del self.held[: max(0, len(self.held) - self.capacity)]

    def rewound(self, n: int) -> None:
        self.held = [pos for pos in self.held if pos <= n]

    def probed(self, offset: int) -> None:
        """One row appended inside a checkpoint and rolled back (a stride position it
        reached was stored, evicting the oldest, then dropped)."""
        self.passed(offset, offset + 1)
        self.rewound(offset)

    def newest_at_or_before(self, n: int) -> int:
        return max((pos for pos in self.held if pos <= n), default=0)
