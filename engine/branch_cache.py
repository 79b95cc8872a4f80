"""Branch-aware cache: the computed tails of recently used branches.

The live state holds one branch. When a request forks away from it (an edit, a switch
to a sibling), the tail past the fork point is kept here: its attention rows and the
recurrent states at the positions where snapshots exist. Shared prefixes are stored
once (in the live state; a tail holds only what follows its fork), and switching back
to a cached branch appends the tail's rows instead of recomputing them. Exact, because
rows for the same positions over the same tokens are the same rows.

Memory is bounded by a budget with least-recently-used eviction. Models with sliding
window layers are not cached here (a ring cannot take appended rows); they re-prefill.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.sequence import SequenceState

MIN_TAIL = 8  # tails shorter than this are cheaper to recompute than to keep


def _key(tokens: list[int]) -> str:
    return hashlib.sha1(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


@dataclass
class Tail:
    base_key: str  # hash of the tokens before the fork
    fork: int
    tokens: list[int]
    rows: list[Any]  # per layer: its `copy_rows` past the fork (None: it keeps no rows)
    recurrent: dict[int, tuple[Any, ...]]  # length past the fork -> per-layer snapshots
    nbytes: int
    # length past the fork -> the state's snapshot store ("stride" or "marked") it came
    # from: restoring a tail puts those back, so later edits inside it resume from them
    stores: dict[int, str]


class BranchCache:
    def __init__(self, budget_bytes: int = 512 << 20) -> None:
        self.budget_bytes = budget_bytes
        self.tails: OrderedDict[int, Tail] = OrderedDict()
        self._next_id = 0

    @staticmethod
    def supports(state: SequenceState) -> bool:
        return all(layer.can_append_rows() for layer in state.layers)

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tails.values())

    def save_tail(self, state: SequenceState, fork: int, keep: int | None = None) -> None:
        """Keep the state's rows past `fork` before the state is truncated there; the
        tail `keep` (about to be restored) is not evicted to make room."""
        if not self._would_keep(state, fork):
            return
        rows = [layer.copy_rows(fork, state.offset) for layer in state.layers]
        recurrent, stores = self._snapshots_past(state, fork)
        nbytes = self._tail_nbytes(state, fork, recurrent)
        tail = Tail(
            _key(state.tokens[:fork]), fork, state.tokens[fork:], rows, recurrent, nbytes, stores
        )
        self.tails[self._next_id] = tail
        self._next_id += 1
        self._evict(keep)

    def evicted_by_saving(self, state: SequenceState, fork: int) -> set[int]:
        """The tails `save_tail(state, fork)` would evict to make room; changes nothing."""
        if not self._would_keep(state, fork):
            return set()
        recurrent, _ = self._snapshots_past(state, fork)
        total = self.nbytes() + self._tail_nbytes(state, fork, recurrent)
        evicted: set[int] = set()
        for tail_id, tail in self.tails.items():  # the same order `_evict` goes in
            if total <= self.budget_bytes:
                break
            evicted.add(tail_id)
            total -= tail.nbytes
        return evicted

    def _would_keep(self, state: SequenceState, fork: int) -> bool:
        return state.offset - fork >= MIN_TAIL and self.supports(state)

    @staticmethod
    def _snapshots_past(
        state: SequenceState, fork: int
    ) -> tuple[dict[int, tuple[Any, ...]], dict[int, str]]:
        """A tail's snapshots by length past the fork, and the store each came from."""
        recurrent: dict[int, tuple[Any, ...]] = {}
        stores: dict[int, str] = {}
        if state.needs_snapshots:  # recurrent layers: the end state, plus stored snapshots
            recurrent[state.offset - fork] = tuple(layer.snapshot() for layer in state.layers)
            for store, pos, snaps in state.snapshot_items():
                if fork < pos < state.offset:
                    recurrent[pos - fork] = snaps
                    stores[pos - fork] = store
        return recurrent, stores

    @staticmethod
    def _tail_nbytes(state: SequenceState, fork: int, recurrent: dict[int, tuple[Any, ...]]) -> int:
        rows = sum(layer.rows_nbytes(fork, state.offset) for layer in state.layers)
        return rows + sum(
            int(a.nbytes)
            for snaps in recurrent.values()
            for snap in snaps
            if snap is not None
            for a in snap
        )

    def _evict(self, keep: int | None = None) -> None:
        while self.nbytes() > self.budget_bytes:
            victim = next((tail_id for tail_id in self.tails if tail_id != keep), None)
            if victim is None:
                return
            del self.tails[victim]

    def best_match(
        self, state: SequenceState, ids: list[int], reuse: int, excluding: Collection[int] = ()
    ) -> tuple[int, int] | None:
        """(tail id, usable length) of the cached tail that beats `reuse`, if any; tails in
        `excluding` (about to be evicted) are passed over."""
        best = None
        for tail_id, tail in self.tails.items():
            if tail_id in excluding:
                continue
            if tail.fork > min(state.offset, len(ids)) or tail.fork > reuse:
                continue
            if _key(ids[: tail.fork]) != tail.base_key:
                continue
            usable = common_prefix(tail.tokens, ids[tail.fork :])
            if state.needs_snapshots:
                usable = max((m for m in tail.recurrent if m <= usable), default=0)
            gain = tail.fork + usable
            if gain > reuse and (best is None or gain > best[1] + self.tails[best[0]].fork):
                best = (tail_id, usable)
        return best

    def restore(self, state: SequenceState, tail_id: int, usable: int) -> None:
        """Append a tail's first `usable` rows to a state sitting exactly at its fork."""
        tail = self.tails[tail_id]
        self.tails.move_to_end(tail_id)
        if state.offset != tail.fork:
            raise ValueError("the state must sit at the tail's fork point")
        snaps = tail.recurrent.get(usable)
        for i, layer in enumerate(state.layers):
            layer.append_cached(tail.rows[i], None if snaps is None else snaps[i], usable)
        state.adopt_tokens(tail.tokens[:usable])
        for length, store in tail.stores.items():  # oldest first, as they were stored
            if length <= usable:
                state.load_snapshot(tail.fork + length, store, tail.recurrent[length])
