"""A sequence's deep-rollback snapshots: the stride ring, the caller-marked (turn boundary)
snapshots, the marks still ahead of the cursor, and one byte budget over both stores.

A snapshot is one opaque entry per layer (engine/state.py's `LayerState.snapshot`); two
entries may share arrays (a recurrent layer's snapshot is a reference, so a stride and a
marked snapshot at one position hold the same arrays), and bytes count each array once.
Eviction: over a store's count capacity its oldest (stride) or least recently stored
(marked) entry goes; over the byte budget, the entry at the lowest position
(`SnapshotPolicy` says why).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from engine.state import SnapshotPolicy

STORES = ("stride", "marked")

Snaps = tuple[Any, ...]


class SnapshotStores:
    def __init__(self, policy: SnapshotPolicy) -> None:
        self.policy = policy
        self.max_bytes = policy.max_snapshot_bytes
        self._stores: dict[str, OrderedDict[int, Snaps]] = {n: OrderedDict() for n in STORES}
        self.pending_marks: set[int] = set()  # positions ahead of the cursor to snapshot

    def capacity(self, store: str) -> int:
        if store == "stride":
            return self.policy.stride_capacity
        return self.policy.marked_capacity

    def put(self, store: str, position: int, snaps: Snaps) -> None:
        """Store as the newest entry of `store`, then evict to its capacity and the budget."""
        entries = self._stores[store]
        capacity = self.capacity(store)
        if not capacity:
            return
        entries[position] = snaps
        entries.move_to_end(position)
        while len(entries) > capacity:
            entries.popitem(last=False)
        self._evict_to_budget()

    def set_budget(self, max_bytes: int | None) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"a snapshot budget must be >= 0 bytes or None, not {max_bytes}")
        self.max_bytes = max_bytes
        self._evict_to_budget()

    def _evict_to_budget(self) -> None:
        if self.max_bytes is None:
            return
        # how many entries hold each array: evicting an entry frees the arrays only it held
        holders: dict[int, int] = {}
        sizes: dict[int, int] = {}
        for array in self.arrays():
            holders[id(array)] = holders.get(id(array), 0) + 1
            sizes[id(array)] = int(array.nbytes)
        total = sum(sizes.values())
        for pos, i in sorted((pos, i) for i, n in enumerate(STORES) for pos in self._stores[n]):
            if total <= self.max_bytes:
                return
            for snap in self._stores[STORES[i]].pop(pos):
                for array in arrays_in(snap):
                    holders[id(array)] -= 1
                    if not holders[id(array)]:
                        total -= sizes[id(array)]

    def is_due(self, position: int) -> bool:
        """Whether a forward ending at `position` should leave a snapshot there."""
        stride = self.policy.stride_capacity and position % self.policy.stride == 0
        return position > 0 and bool(stride or position in self.pending_marks)

    def take(self, position: int, snaps: Snaps) -> None:
        """`snaps` is the state at a due `position`: store it where it is due."""
        if position in self.pending_marks:
            self.pending_marks.discard(position)
            self.put("marked", position, snaps)
        if position % self.policy.stride == 0:
            self.put("stride", position, snaps)

    def due_between(self, start: int, end: int) -> list[int]:
        """The due positions p with start < p < end, in order."""
        stride = self.policy.stride
        due = set(range((start // stride + 1) * stride, end, stride))
        if not self.policy.stride_capacity:
            due.clear()
        due |= {p for p in self.pending_marks if start < p < end}
        return sorted(due)

    def next_due(self, offset: int) -> int | None:
        stride = self.policy.stride
        due = [(offset // stride + 1) * stride] if self.policy.stride_capacity else []
        due += [p for p in self.pending_marks if p > offset]
        return min(due) if due else None

    def drop_after(self, position: int) -> None:
        """Forget entries past `position` and every pending mark: after a rewind the
        tokens past it are unknown, so marks requested for them are stale."""
        for entries in self._stores.values():
            for pos in [p for p in entries if p > position]:
                del entries[pos]
        self.pending_marks.clear()

    def clear(self) -> None:
        for entries in self._stores.values():
            entries.clear()
        self.pending_marks.clear()

    def positions(self) -> list[int]:
        return sorted({pos for entries in self._stores.values() for pos in entries})

    def merged(self) -> dict[int, Snaps]:
        """Position -> snaps over both stores (a marked entry wins a shared position)."""
        merged: dict[int, Snaps] = {}
        for name in STORES:
            merged.update(self._stores[name])
        return merged

    def items(self) -> list[tuple[str, int, Snaps]]:
        return [(n, pos, snaps) for n in STORES for pos, snaps in self._stores[n].items()]

    def arrays(self) -> Iterable[Any]:
        for entries in self._stores.values():
            for snaps in entries.values():
                for snap in snaps:
                    yield from arrays_in(snap)

    def nbytes(self) -> int:
        return distinct_nbytes(self.arrays())


def arrays_in(snap: Any) -> list[Any]:
    """The arrays of one layer's snapshot (None, an array, or a tuple of arrays)."""
    if snap is None:
        return []
    if isinstance(snap, tuple):
        return [a for a in snap if hasattr(a, "nbytes")]
    return [snap]


def distinct_nbytes(arrays: Iterable[Any]) -> int:
    """Bytes of the arrays, each counted once however many entries hold it."""
    seen = {id(a): int(a.nbytes) for a in arrays if a is not None}
    return sum(seen.values())
