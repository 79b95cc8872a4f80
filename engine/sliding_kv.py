"""A sliding-window attention layer's key/value rows: a ring of `window + slack` rows, the
row of position p in slot p % size. It rewinds by moving a cursor as far as the rows it
still holds allow (`max_rollback`); deeper needs a snapshot of the ring. A forward's rows
are written into the ring only when the forward succeeds, and a verify records the rows
it appends and what they overwrite, so the ring at any position inside it can be rebuilt
(the snapshots due there) without a model pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import StateError
from engine.kv_state import CursorRows, check_kv_dtype, kv_rows
from kernels.masks import WindowMask
from kernels.ops import Array, Ops


@dataclass
class RingTape:
    """What a sliding ring recorded during a verify: the rows it appended and, for each
    slot they overwrote, that slot's row and position from before the checkpoint."""

    keys: list[Array] = field(default_factory=list)  # [Hkv, rows, D] pieces
    values: list[Array] = field(default_factory=list)
    overwritten: dict[int, tuple[Array, Array, int]] = field(default_factory=dict)

    def num_rows(self) -> int:
        return sum(int(k.shape[1]) for k in self.keys)


class SlidingKV(CursorRows):
    """A ring of `window + slack` KV rows [Hkv, size, D] (C-contiguous, `ops.kv_dtype`);
    the row of position p lives in slot p % size, and `positions[slot]` says which."""

    kind = "SlidingKV"

    def __init__(self, ops: Ops, num_kv_heads: int, head_dim: int, window: int, slack: int):
        if window < 1 or slack < 0:
            raise ValueError("window must be >= 1 and slack >= 0")
        self.ops = ops
        self.window, self.slack, self.size = window, slack, window + slack
        self.keys = ops.zeros((num_kv_heads, self.size, head_dim), ops.kv_dtype)
        self.values = ops.zeros((num_kv_heads, self.size, head_dim), ops.kv_dtype)
        self.positions = np.full(self.size, -1, dtype=np.int64)  # host-side metadata
        self.length = 0
        self.tape: RingTape | None = None  # set while a verify is being recorded
        # A forward's rows (start, k, v) are written into the ring when it succeeds: until
        # then the ring is as before it, so a failed forward is undone by forgetting them.
        self._pending: tuple[int, Array, Array] | None = None

    def append(self, k: Array, v: Array) -> tuple[Array, Array, Any]:
        L = int(k.shape[1])
        start = self.length
        # rounded to the ring's dtype before anything reads them: a verify's later rows see
        # these as a single step's would see them in the ring
        k, v = kv_rows(self.ops, k), kv_rows(self.ops, v)
        # Attend over the ring as it was plus the new rows; the rows go into the ring at
        # the forward's end (a chunk longer than the slack would otherwise overwrite rows
        # its own first queries need).
        keys = self.ops.concat([self.keys, k], axis=1)
        values = self.ops.concat([self.values, v], axis=1)
        k_pos = np.concatenate([self.positions, np.arange(start, start + L)])
        mask = WindowMask.of(start, L, k_pos, self.window)
        self._pending = (start, k, v)
        self.length = start + L
        return keys, values, mask

    def _write(self, keys: Array, values: Array, positions: np.ndarray, rows: Any) -> Any:
        """Rows (start, k, v) written into a ring; only the last `size` of them survive."""
        start, k, v = rows
        L = int(k.shape[1])
        j = max(0, L - self.size)
        while j < L:  # the slots are one span of the ring, or two where it wraps
            slot = (start + j) % self.size
            n = min(L - j, self.size - slot)
            keys = self.ops.write_rows(keys, slot, k[:, j : j + n])
            values = self.ops.write_rows(values, slot, v[:, j : j + n])
            positions[slot : slot + n] = np.arange(start + j, start + j + n)
            j += n
        return keys, values

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
        new_k = ops.concat(self.tape.keys, axis=1)[:, :num_rows]
        new_v = ops.concat(self.tape.values, axis=1)[:, :num_rows]
        keys, values = self._write(keys, values, positions, (start, new_k, new_v))
        ops.evaluate(keys, values)  # a failure shows before the verify is closed
        return keys, values, positions

    # -- a forward's end, or its failure ----------------------------------------------
    def begin_forward(self) -> Any:
        return self.length

    def end_forward(self) -> None:
        """Write the forward's rows into the ring (recording what they overwrite)."""
        if self._pending is None:
            return
        if self.tape is not None:
            self._record(self.tape, *self._pending)
        self.keys, self.values = self._write(self.keys, self.values, self.positions, self._pending)
        self._pending = None

    def undo_forward(self, point: Any) -> bool:
        self._pending = None  # nothing was written into the ring (but by a kernel: below)
        self.positions[self.positions >= point] = -1
        self.length = point
        return True

    def live_arrays(self) -> list[Array]:
        pending = [] if self._pending is None else [self._pending[1], self._pending[2]]
        return [self.keys, self.values, *pending]

    def _record(self, tape: RingTape, start: int, k: Array, v: Array) -> None:
        """Tape a verify's rows and the slots they overwrite."""
        tape.keys.append(k)
        tape.values.append(v)
        L = int(k.shape[1])
        self._tape_overwritten(
            tape, [(start + j) % self.size for j in range(max(0, L - self.size), L)]
        )

    def _tape_overwritten(self, tape: RingTape, slots: list[int]) -> None:
        """For slots overwritten for the first time since the checkpoint, the slot as it
        was (one copy of the span they lie in)."""
        first_time = [slot for slot in slots if slot not in tape.overwritten]
        if not first_time:
            return
        lo, hi = min(first_time), max(first_time) + 1
        keys = self.ops.snapshot(self.keys[:, lo:hi])
        values = self.ops.snapshot(self.values[:, lo:hi])
        for slot in first_time:
            i = slot - lo
            row = (keys[:, i : i + 1], values[:, i : i + 1], int(self.positions[slot]))
            tape.overwritten[slot] = row

    # -- rows a kernel writes into the ring in place (engine/runner/fused.py) -----------
    def before_kernel_write(self, start: int, num_rows: int) -> None:
        """Before a kernel writes the rows of positions start .. start + num_rows straight
        into their slots: a recording verify tapes what they overwrite, and the rows those
        slots held are gone from here on (a failed forward leaves the ring rewinding less
        far, never reading them). The forward's queries need none of them while
        `num_rows <= slack`."""
        if num_rows > self.slack or start != self.length:
            raise StateError(
                f"a kernel's {num_rows} rows at {start} into a ring of slack {self.slack} "
                f"holding {self.length} positions"
            )
        if num_rows == 1 and self.tape is None:  # a decode step: one slot, no lists
            self.positions[start % self.size] = -1
            return
        slots = self._slots(start, num_rows)
        if self.tape is not None:
            self._tape_overwritten(self.tape, slots)
        self.positions[slots] = -1

    def after_kernel_write(self, start: int, num_rows: int) -> None:
        """The kernel's rows are in the ring: their positions, the cursor, and a recording
        verify's copy of them."""
        self.length = start + num_rows
        if num_rows == 1 and self.tape is None:
            self.positions[start % self.size] = start
            return
        slots = self._slots(start, num_rows)
        self.positions[slots] = np.arange(start, start + num_rows)
        if self.tape is not None:
            first, last = slots[0], slots[-1] + 1
            spans = [(first, last)] if last > first else [(first, self.size), (0, last)]
            ops = self.ops
            self.tape.keys += [ops.snapshot(self.keys[:, a:b]) for a, b in spans]
            self.tape.values += [ops.snapshot(self.values[:, a:b]) for a, b in spans]

    def _slots(self, start: int, num_rows: int) -> list[int]:
        return [(start + j) % self.size for j in range(num_rows)]

    def snapshot(self) -> Any:
        """A copy of the ring, with a forward's rows not yet written (the snapshot due
        where the forward ends is taken before its rows are committed)."""
        keys, values = self.ops.snapshot(self.keys), self.ops.snapshot(self.values)
        positions = self.positions.copy()
        if self._pending is not None:
            keys, values = self._write(keys, values, positions, self._pending)
            self.ops.evaluate(keys, values)
        return keys, values, positions

    def restore(self, snap: Any, position: int) -> None:
        keys, values, positions = snap
        self.keys, self.values = self.ops.snapshot(keys), self.ops.snapshot(values)
        self.positions = positions.copy()
        self.length = position

    def reset(self) -> None:
        self._pending = None
        self.keys = self.ops.zeros(tuple(self.keys.shape), self.ops.kv_dtype)
        self.values = self.ops.zeros(tuple(self.values.shape), self.ops.kv_dtype)
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
        check_kv_dtype(self.ops, arrays)
        self.keys = self.ops.zeros(tuple(self.keys.shape), self.ops.kv_dtype)
        self.keys = self.ops.write_rows(self.keys, 0, arrays["k"])
        self.values = self.ops.zeros(tuple(self.values.shape), self.ops.kv_dtype)
        self.values = self.ops.write_rows(self.values, 0, arrays["v"])
        self.positions = np.asarray(arrays["pos"], dtype=np.int64).copy()
        self.length = length
