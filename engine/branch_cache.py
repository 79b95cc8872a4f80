"""Branch-aware cache: the computed tails of recently used branches.

The live state holds one branch. When a request forks away from it (an edit, a switch
to a sibling), the tail past the fork point is kept here: its attention rows and the
recurrent states at the positions where snapshots exist. Shared prefixes are stored
once (in the live state; a tail holds only what follows its fork), and switching back
to a cached branch appends the tail's rows instead of recomputing them. Exact, because
rows for the same positions over the same tokens are the same rows.

Each distinct tail is held once (a switch back and forth between two branches keeps one
tail each), and memory is bounded by a budget with least-recently-used eviction
(engine/memory.py sets it, under the one memory budget). Models with sliding
window layers are not cached here (a ring cannot take appended rows); they re-prefill.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.sequence import SequenceState

MIN_TAIL = 8  # tails shorter than this are cheaper to recompute than to keep
NEW = -1  # a save plan's id for the tail it would add (held ids count up from 0)


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
    rows_nbytes: int
    # length past the fork -> the state's snapshot store ("stride" or "marked") it came
    # from: restoring a tail puts those back, so later edits inside it resume from them
    stores: dict[int, str]

    @property
    def end(self) -> int:
        return self.fork + len(self.tokens)

    @property
    def nbytes(self) -> int:
        return self.rows_nbytes + _snapshots_nbytes(self.recurrent.values())


@dataclass(frozen=True)
class _SavePlan:
    """What saving one state's tail does, worked out before anything changes."""

    into: int | None  # a held tail that already has these tokens: it gains their snapshots
    replaced: frozenset[int]  # held tails the new one contains whole: it takes their place
    evicted: frozenset[int]  # tails the budget then evicts, least recently used first
    points: dict[int, tuple[Any, ...]]  # absolute position -> snapshots, all the tail will hold
    stores: dict[int, str]  # absolute position -> the store those snapshots came from


class BranchCache:
    """Tails by id, least recently used first. Each distinct tail is held once: saving a
    branch whose tokens a held tail already has refreshes that tail (and adds the
    snapshots it lacked); a saved tail that contains a held one whole replaces it."""

    def __init__(self, budget_bytes: int = 512 << 20) -> None:
        self.budget_bytes = budget_bytes
        self.tails: OrderedDict[int, Tail] = OrderedDict()
        self._next_id = 0

    @staticmethod
    def supports(state: SequenceState) -> bool:
        return all(layer.can_append_rows() for layer in state.layers)

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tails.values())

    def set_budget(self, max_bytes: int) -> None:
        """Bound the cache to `max_bytes`, evicting least recently used tails now."""
        if max_bytes < 0:
            raise ValueError(f"the branch cache's budget must be >= 0, not {max_bytes}")
        self.budget_bytes = max_bytes
        self._evict()

    def save_tail(self, state: SequenceState, fork: int, keep: int | None = None) -> None:
        """Keep the state's rows past `fork` before the state is truncated there; the
        tail `keep` (about to be restored) is not evicted to make room."""
        plan = self._plan_save(state, fork, keep)
        if plan is None:
            return
        for tail_id in plan.replaced:
            del self.tails[tail_id]
        if NEW in plan.evicted:  # over the budget on its own: nothing else is kept either
            for tail_id in plan.evicted - {NEW}:
                del self.tails[tail_id]
            return
        if plan.into is not None:
            tail = self.tails[plan.into]
            self.tails.move_to_end(plan.into)
        else:
            rows = [layer.copy_rows(fork, state.offset) for layer in state.layers]
            tail = Tail(
                _key(state.tokens[:fork]),
                fork,
                state.tokens[fork:],
                rows,
                {},
                sum(layer.rows_nbytes(fork, state.offset) for layer in state.layers),
                {},
            )
            self.tails[self._next_id] = tail
            self._next_id += 1
        tail.recurrent = {pos - tail.fork: snaps for pos, snaps in sorted(plan.points.items())}
        tail.stores = {pos - tail.fork: store for pos, store in sorted(plan.stores.items())}
        for tail_id in plan.evicted:
            del self.tails[tail_id]

    def evicted_by_saving(self, state: SequenceState, fork: int) -> set[int]:
        """The tails `save_tail(state, fork)` would drop (replaced by it, or evicted to make
        room); changes nothing."""
        plan = self._plan_save(state, fork, None)
        return set() if plan is None else set(plan.replaced | plan.evicted) - {NEW}

    def _plan_save(self, state: SequenceState, fork: int, keep: int | None) -> _SavePlan | None:
        if state.offset - fork < MIN_TAIL or not self.supports(state):
            return None
        points, stores = self._snapshots_past(state, fork)
        into = next((i for i, t in self.tails.items() if _holds(t, state, fork)), None)
        replaced: set[int] = set()
        if into is not None:  # the held tail's own snapshots win where both have one
            held = self.tails[into]
            points.update({held.fork + k: snaps for k, snaps in held.recurrent.items()})
            stores.update({held.fork + k: store for k, store in held.stores.items()})
            rows_nbytes = held.rows_nbytes
        else:
            replaced = {i for i, t in self.tails.items() if i != keep and _contains(state, fork, t)}
            for tail_id in replaced:  # their snapshots inside the new tail stay restorable
                t = self.tails[tail_id]
                for k, snaps in t.recurrent.items():
                    points.setdefault(t.fork + k, snaps)
                for k, store in t.stores.items():
                    stores.setdefault(t.fork + k, store)
            rows_nbytes = sum(layer.rows_nbytes(fork, state.offset) for layer in state.layers)
        # the order after saving: the saved tail last (most recently used); NEW stands
        # for a tail not stored yet, evicted too when it alone is over the budget
        sizes = {i: t.nbytes for i, t in self.tails.items() if i not in replaced and i != into}
        sizes[NEW if into is None else into] = rows_nbytes + _snapshots_nbytes(points.values())
        total = sum(sizes.values())
        evicted: set[int] = set()
        for tail_id, size in sizes.items():  # the same order `_evict` goes in
            if total <= self.budget_bytes:
                break
            if tail_id != keep:
                evicted.add(tail_id)
                total -= size
        return _SavePlan(into, frozenset(replaced), frozenset(evicted), points, stores)

    @staticmethod
    def _snapshots_past(
        state: SequenceState, fork: int
    ) -> tuple[dict[int, tuple[Any, ...]], dict[int, str]]:
        """The snapshots a tail past `fork` keeps, by absolute position, and their stores."""
        points: dict[int, tuple[Any, ...]] = {}
        stores: dict[int, str] = {}
        if state.needs_snapshots:  # recurrent layers: the end state, plus stored snapshots
            points[state.offset] = tuple(layer.snapshot() for layer in state.layers)
            for store, pos, snaps in state.snapshot_items():
                if fork < pos < state.offset:
                    points[pos] = snaps
                    stores[pos] = store
        return points, stores

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


def _holds(tail: Tail, state: SequenceState, fork: int) -> bool:
    """The held `tail` already has every row the state's tail past `fork` would."""
    if not tail.fork <= fork or state.offset > tail.end:
        return False
    if state.tokens[tail.fork :] != tail.tokens[: state.offset - tail.fork]:
        return False
    return _key(state.tokens[: tail.fork]) == tail.base_key


def _contains(state: SequenceState, fork: int, tail: Tail) -> bool:
    """The state's tail past `fork` has every row of the held `tail`."""
    if not fork <= tail.fork or tail.end > state.offset:
        return False
    if state.tokens[tail.fork : tail.end] != tail.tokens:
        return False
    return _key(state.tokens[: tail.fork]) == tail.base_key


def _snapshots_nbytes(snapshots: Iterable[tuple[Any, ...]]) -> int:
    """Bytes of the arrays in per-layer snapshots, each distinct array counted once (a
    snapshot is a reference: the same array may sit in several)."""
    seen: dict[int, int] = {}
    for snaps in snapshots:
        for snap in snaps:
            for arr in () if snap is None else snap:
                seen[id(arr)] = int(arr.nbytes)
    return sum(seen.values())
