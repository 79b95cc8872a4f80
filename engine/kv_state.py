"""Attention layers' key/value rows: `FullKV` (one row per position) and `SlidingKV` (a
ring over the last `window + slack` positions). Both undo a verify by moving a cursor,
so neither tapes anything; how they answer the rest of the `LayerState` protocol
(engine/state.py) is where they differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import StateError
from kernels.ops import Array, Ops

_GROW = 256  # KV rows are allocated in whole chunks of this many positions
_GROWTH = 1.5  # a full buffer grows by this factor: amortised O(1) copies per row
UNBOUNDED_DEPTH = 1 << 30  # "any number of rows", where a layer sets no bound


def causal_mask(q_start: int, num_q: int, k_positions: np.ndarray, window: int = 0) -> Any:
    """bool [num_q, S]: query at q_start+i sees key positions <= its own (and > pos-window)."""
    q_pos = np.arange(q_start, q_start + num_q)[:, None]
    mask = (k_positions[None, :] <= q_pos) & (k_positions[None, :] >= 0)
    if window:
        mask &= k_positions[None, :] > q_pos - window
    return mask


class _CursorRows:
    """What both attention caches share: rows past a verify's checkpoint are dropped by
    rewinding the cursor (`adopt_verified`, validated beforehand by `can_rewind`), so a
    checkpoint holds no snapshot."""

    keys: Any
    values: Any
    length: int

    def checkpoint_snapshot(self) -> Any:
        return None

    def live_arrays(self) -> list[Array]:
        return [a for a in (self.keys, self.values) if a is not None]


class FullKV(_CursorRows):
    """Full-attention KV rows [Hkv, capacity, D]; rows past `length` are garbage."""

    kind = "FullKV"

    def __init__(self, ops: Ops, num_kv_heads: int, head_dim: int) -> None:
        self.ops = ops
        self.shape = (num_kv_heads, head_dim)
        self.keys: Any = None
        self.values: Any = None
        self.length = 0

    def capacity(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[1])

    def append(self, k: Array, v: Array) -> tuple[Array, Array, Any]:
        L = int(k.shape[1])
        start, end = self.length, self.length + L
        self._make_room(end)
        self.keys = self.ops.write_rows(self.keys, start, k)
        self.values = self.ops.write_rows(self.values, start, v)
        self.length = end
        mask = None if L == 1 else causal_mask(start, L, np.arange(end))
        return self.keys[:, :end], self.values[:, :end], mask

    def _make_room(self, end: int) -> None:
        """Grow geometrically: fixed-size steps would copy O(n^2) rows over a long context."""
        if end > self.capacity():
            self.reserve(max(end, int(self.capacity() * _GROWTH)))

    def reserve(self, needed: int) -> None:
        """Reallocate to `needed` rows rounded up to a whole chunk, keeping the rows held:
        exactly that capacity, so callers can give every layer the same one (the fused
        step). Always reallocates (even to the same capacity): check `capacity()` first.
        """
        H, D = self.shape
        new_cap = -(-needed // _GROW) * _GROW
        fresh_k = self.ops.zeros((H, new_cap, D))
        fresh_v = self.ops.zeros((H, new_cap, D))
        if self.keys is not None and self.length:
            fresh_k = self.ops.write_rows(fresh_k, 0, self.keys[:, : self.length])
            fresh_v = self.ops.write_rows(fresh_v, 0, self.values[:, : self.length])
        self.keys, self.values = fresh_k, fresh_v

    def replace_buffers(self, keys: Array, values: Array, length: int) -> None:
        """Adopt full-capacity buffers written elsewhere (a fused decode step) and their cursor."""
        self.keys, self.values = keys, values
        self.length = length

    def needs_snapshots(self) -> bool:
        return False  # rows up to any earlier position stay valid: the cursor reaches them

    def max_rollback(self) -> int:
        return self.length

    def can_rewind(self, depth: int) -> bool:
        return True  # rows up to any earlier position stay valid

    def snapshot(self) -> Any:
        return None  # rows up to any earlier position stay valid: the cursor is enough

    def restore(self, snap: Any, position: int) -> None:
        self.length = position

    def rewind(self, position: int) -> None:
        self.length = position

    def adopt_verified(self, replayed: Any, position: int) -> None:
        self.rewind(position)

    def start_tape(self) -> None:
        """Nothing to record: a rewind alone takes the rows back."""

    def stop_tape(self) -> None:
        """Nothing was recorded."""

    def tape_covers(self, num_rows: int) -> bool:
        return True

    def max_retain_depth(self) -> int:
        return UNBOUNDED_DEPTH  # every row stays until overwritten past the cursor

    def replay_verified(
        self, snap: Any, start: int, num_kept: int, stops: Sequence[int]
    ) -> tuple[list[Any], Any]:
        return [None] * len(stops), None  # the cursor reaches every position

    def begin_forward(self) -> Any:
        return self.length, self.keys is not None

    def end_forward(self) -> None:
        """Nothing to drop: the restore point is the cursor."""

    def undo_forward(self, point: Any) -> bool:
        length, had_buffers = point
        if had_buffers and self.keys is None:
            return False  # a fused step donated its buffers and failed: the rows are gone
        self.length = length  # rows before it are untouched: writes land past the cursor
        return True

    def reset(self) -> None:
        self.length = 0

    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return self.ops.nbytes(self.keys) + self.ops.nbytes(self.values)

    def can_append_rows(self) -> bool:
        return True

    def copy_rows(self, start: int, end: int) -> tuple[Array, Array]:
        """Rows [start, end) as new arrays (for the branch cache)."""
        ops = self.ops
        return ops.snapshot(self.keys[:, start:end]), ops.snapshot(self.values[:, start:end])

    def rows_nbytes(self, start: int, end: int) -> int:
        return self.ops.nbytes(self.keys[:, start:end]) + self.ops.nbytes(self.values[:, start:end])

    def append_cached(self, rows: Any, snap: Any, num_rows: int) -> None:
        """Append the first `num_rows` of rows computed earlier for the same positions and
        prefix (`copy_rows`'s output); the snapshot is not needed."""
        keys, values = rows[0][:, :num_rows], rows[1][:, :num_rows]
        end = self.length + int(keys.shape[1])
        self._make_room(end)
        self.keys = self.ops.write_rows(self.keys, self.length, keys)
        self.values = self.ops.write_rows(self.values, self.length, values)
        self.length = end

    def arrays(self) -> dict[str, Array]:
        if self.keys is None or self.length == 0:
            return {}
        return {"k": self.keys[:, : self.length], "v": self.values[:, : self.length]}

    def load_arrays(self, arrays: dict[str, Array], length: int) -> None:
        self.keys = self.values = None
        self.length = 0
        if length:
            self.reserve(length)
            self.keys = self.ops.write_rows(self.keys, 0, arrays["k"])
            self.values = self.ops.write_rows(self.values, 0, arrays["v"])
        self.length = length


@dataclass
class RingTape:
    """What a sliding ring recorded during a verify: the rows it appended and, for each
    slot they overwrote, that slot's row and position from before the checkpoint."""

    keys: list[Array] = field(default_factory=list)  # [Hkv, rows, D] pieces
    values: list[Array] = field(default_factory=list)
    overwritten: dict[int, tuple[Array, Array, int]] = field(default_factory=dict)

    def num_rows(self) -> int:
        return sum(int(k.shape[1]) for k in self.keys)


class SlidingKV(_CursorRows):
    """A ring of `window + slack` KV rows; row of position p lives in slot p % size."""

    kind = "SlidingKV"

    def __init__(self, ops: Ops, num_kv_heads: int, head_dim: int, window: int, slack: int):
        if window < 1 or slack < 0:
            raise ValueError("window must be >= 1 and slack >= 0")
        self.ops = ops
        self.window, self.slack, self.size = window, slack, window + slack
        self.keys = ops.zeros((num_kv_heads, self.size, head_dim))
        self.values = ops.zeros((num_kv_heads, self.size, head_dim))
        self.positions = np.full(self.size, -1, dtype=np.int64)  # host-side metadata
        self.length = 0
        self.tape: RingTape | None = None  # set while a verify is being recorded
        # the ring as it was before this forward's writes, while a forward runs
        self._before: tuple[Array, Array, np.ndarray] | None = None

    def append(self, k: Array, v: Array) -> tuple[Array, Array, Any]:
        L = int(k.shape[1])
        start = self.length
        # Attend over the ring as it was plus the new rows, then write: a chunk longer
        # than the slack would otherwise overwrite rows its own first queries need.
        keys = self.ops.concat([self.keys, k], axis=1)
        values = self.ops.concat([self.values, v], axis=1)
        k_pos = np.concatenate([self.positions, np.arange(start, start + L)])
        # the concatenation already holds the old ring: a failed forward restores it free
        self._before = (keys, values, k_pos)
        mask = causal_mask(start, L, k_pos, self.window)
        if self.tape is not None:
            self.tape.keys.append(k)
            self.tape.values.append(v)
        for j in range(max(0, L - self.size), L):  # only the last `size` rows survive
            slot = (start + j) % self.size
            if self.tape is not None and slot not in self.tape.overwritten:
                self.tape.overwritten[slot] = self._slot(slot)
            self.keys = self.ops.write_rows(self.keys, slot, k[:, j : j + 1])
            self.values = self.ops.write_rows(self.values, slot, v[:, j : j + 1])
            self.positions[slot] = start + j
        self.length = start + L
        return keys, values, mask

    def needs_snapshots(self) -> bool:
        return True  # a rewind deeper than the slack needs the ring as it was

    def max_rollback(self) -> int:
        """How many positions back a rewind can go with the rows the ring still holds."""
        oldest = int(self.positions[self.positions >= 0].min()) if self.length else 0
        if oldest == 0:  # nothing evicted yet: every earlier position is still held
            return self.length
        # a query at position n needs keys n-window+1 .. n-1
        return max(0, self.length - (oldest + self.window - 1))

    def can_rewind(self, depth: int) -> bool:
        return depth <= self.max_rollback()

    def rewind(self, position: int) -> None:
        if self.length - position > self.max_rollback():
            raise StateError(
                f"sliding-window layer cannot rewind {self.length - position} positions "
                f"(ring slack allows {self.max_rollback()}); a snapshot is needed"
            )
        self.positions[self.positions >= position] = -1
        self.length = position

    def adopt_verified(self, replayed: Any, position: int) -> None:
        self.rewind(position)

    def _slot(self, slot: int) -> tuple[Array, Array, int]:
        """A copy of one slot's rows and its position (the ring is written in place)."""
        ops = self.ops
        k, v = self.keys[:, slot : slot + 1], self.values[:, slot : slot + 1]
        return ops.snapshot(k), ops.snapshot(v), int(self.positions[slot])

    # -- a verify: the ring at any position inside it, for the snapshots due there -----
    def start_tape(self) -> None:
        self.tape = RingTape()

    def stop_tape(self) -> None:
        self.tape = None

    def tape_covers(self, num_rows: int) -> bool:
        return self.tape is not None and self.tape.num_rows() == num_rows

    def max_retain_depth(self) -> int:
        # Once the ring has wrapped a rewind reaches `slack + 1` positions back, however
        # many rows a verify appended; before, it reaches every position.
        return self.slack + 1

    def replay_verified(
        self, snap: Any, start: int, num_kept: int, stops: Sequence[int]
    ) -> tuple[list[Any], Any]:
        return [self._ring_at(start, stop - start) for stop in stops], None

    def _ring_at(self, start: int, num_rows: int) -> Any:
        """A snapshot of the ring as it was `num_rows` rows past the checkpoint at
        `start`: the slots put back as they were at the checkpoint, then those rows."""
        if self.tape is None:
            raise StateError("no verify tape to rebuild the ring from")
        ops = self.ops
        keys, values = ops.snapshot(self.keys), ops.snapshot(self.values)
        positions = self.positions.copy()
        for slot, (k, v, pos) in self.tape.overwritten.items():
            keys, values = ops.write_rows(keys, slot, k), ops.write_rows(values, slot, v)
            positions[slot] = pos
        new_k = ops.concat(self.tape.keys, axis=1)
        new_v = ops.concat(self.tape.values, axis=1)
        for j in range(max(0, num_rows - self.size), num_rows):
            slot = (start + j) % self.size
            keys = ops.write_rows(keys, slot, new_k[:, j : j + 1])
            values = ops.write_rows(values, slot, new_v[:, j : j + 1])
            positions[slot] = start + j
        ops.evaluate(keys, values)  # a failure shows before the verify is closed
        return keys, values, positions

    # -- a failed forward ---------------------------------------------------------------
    def begin_forward(self) -> Any:
        self._before = None
        return self.length, (len(self.tape.keys) if self.tape is not None else 0)

    def end_forward(self) -> None:
        self._before = None  # the old ring's copy would double this layer's memory

    def undo_forward(self, point: Any) -> bool:
        length, pieces = point
        if self._before is not None:  # the writes may have begun: put the old ring back
            # views of the concatenation, nobody else's: no allocation, which an undo
            # after running out of memory should not need
            keys, values, k_pos = self._before
            self.keys, self.values = keys[:, : self.size], values[:, : self.size]
            self.positions = k_pos[: self.size]
            self._before = None
        self.length = length
        if self.tape is not None:
            # a slot first overwritten by the failed forward holds its old row again,
            # which is what `overwritten` recorded for it: only the new rows go
            del self.tape.keys[pieces:], self.tape.values[pieces:]
        return True

    def snapshot(self) -> Any:
        return (
            self.ops.snapshot(self.keys),
            self.ops.snapshot(self.values),
            self.positions.copy(),
        )

    def restore(self, snap: Any, position: int) -> None:
        keys, values, positions = snap
        self.keys, self.values = self.ops.snapshot(keys), self.ops.snapshot(values)
        self.positions = positions.copy()
        self.length = position

    def reset(self) -> None:
        self._before = None
        self.keys = self.ops.zeros(tuple(self.keys.shape))
        self.values = self.ops.zeros(tuple(self.values.shape))
        self.positions = np.full(self.size, -1, dtype=np.int64)
        self.length = 0

    def nbytes(self) -> int:
        return self.ops.nbytes(self.keys) + self.ops.nbytes(self.values)

    def can_append_rows(self) -> bool:
        return False  # slots are assigned by position modulo the ring: rows cannot be spliced

    def copy_rows(self, start: int, end: int) -> Any:
        raise StateError("a sliding window's ring cannot hand out rows for the branch cache")

    def rows_nbytes(self, start: int, end: int) -> int:
        raise StateError("a sliding window's ring cannot hand out rows for the branch cache")

    def append_cached(self, rows: Any, snap: Any, num_rows: int) -> None:
        raise StateError("a sliding window's ring cannot take appended rows")

    def arrays(self) -> dict[str, Array]:
        return {"k": self.keys, "v": self.values, "pos": self.positions}

    def load_arrays(self, arrays: dict[str, Array], length: int) -> None:
        self.keys = self.ops.asarray(arrays["k"])
        self.values = self.ops.asarray(arrays["v"])
        self.positions = np.asarray(arrays["pos"], dtype=np.int64).copy()
        self.length = length
