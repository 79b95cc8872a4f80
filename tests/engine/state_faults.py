"""What the state property test (test_state_property.py) needs beside the state itself:
injected failures, and the stride snapshots a state must hold after what it went through.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from engine.state import SnapshotPolicy


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
