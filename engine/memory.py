"""One byte budget over everything a session keeps beside the weights: the live state
(KV rows and recurrent state, the draft model's and the block drafter's context rows
included), the deep-rollback snapshots, the branch cache's tails and the lookup drafter's
index.

Eviction, when the parts together pass the budget, goes in this order:

1. branch-cache tails, least recently used first (switching back to that branch
   recomputes its tail);
2. snapshots, lowest position first (engine/snapshot_store.py: a truncate then replays
   from an earlier snapshot, at worst from the start; still exact, only slower);
3. the lookup drafter's index, rebuilt from the newest contexts that fit (drafts over
   older branches stop matching; it is small, so it goes last).

The live state is never evicted: the request needs every row of it. When it alone passes
the budget the request still runs, everything else is evicted, and Stats shows the
total above the budget. The budget is enforced at request boundaries (before a request is
planned and after it ends); in between each part keeps to the share it was given then
(the branch cache when it saves a tail, the snapshot stores when they take one, the
drafter when its request ends), so the live state's growth during one request can pass
the budget until the request ends.

The default is a quarter of the machine's physical memory: the weights, the app and the
rest of the system need the remainder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.branch_cache import BranchCache
from engine.sequence import SequenceState
from engine.snapshot_store import arrays_in
from engine.suffix_drafter import SuffixDrafter

DEFAULT_SHARE = 4  # the default budget: 1/DEFAULT_SHARE of physical memory
FALLBACK_MEMORY_BYTES = 8 << 30  # where the platform does not say (no os.sysconf)
MIN_DEFAULT_BUDGET_BYTES = 256 << 20


def physical_memory_bytes() -> int | None:
    """The machine's physical memory (Linux, macOS, the BSDs); None where unknown."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        return None


def default_budget_bytes(physical: int | None = None) -> int:
    """A quarter of physical memory (of `physical` when given), at least 256 MiB."""
    total = physical if physical is not None else physical_memory_bytes()
    share = (total or FALLBACK_MEMORY_BYTES) // DEFAULT_SHARE
    return max(share, MIN_DEFAULT_BUDGET_BYTES)


@dataclass(frozen=True)
class MemoryUse:
    """Bytes held by each part, as Stats reports them. `snapshots` counts only arrays the
    live state does not hold too, and `total` counts an array shared by several parts
    once (a recurrent snapshot is a reference: a tail and the live state may share one)."""

    kv: int  # the live state: KV rows and recurrent state (the draft model's and the block
    # drafter's context rows included)
    snapshots: int
    branch_cache: int
    drafter: int  # the lookup drafter's index
    total: int
    budget: int


class MemoryBudget:
    def __init__(self, max_bytes: int | None = None) -> None:
        """`max_bytes`: None for the default (`default_budget_bytes`)."""
        self.max_bytes = _checked(max_bytes)

    def set_budget(self, max_bytes: int | None) -> None:
        self.max_bytes = _checked(max_bytes)

    def enforce(
        self,
        states: Sequence[SequenceState],
        branches: BranchCache,
        drafter: SuffixDrafter,
        live: Sequence[Any] = (),
    ) -> MemoryUse:
        """Give each part its share of what the live states leave, in the order of the
        module docstring (the last to be evicted is served first), and evict now what
        does not fit. `states`: the session's state first, then the draft model's; `live`:
        other parts the context needs whole (`nbytes()`: the block drafter's rows)."""
        room = max(0, self.max_bytes - _live_bytes(states, live))
        drafter.set_budget(room)
        room = max(0, room - drafter.nbytes())
        for state in states:
            state.set_snapshot_budget(room)
            room = max(0, room - _own_snapshot_bytes(state))
        branches.set_budget(room)
        return self.measure(states, branches, drafter, live)

    def measure(
        self,
        states: Sequence[SequenceState],
        branches: BranchCache,
        drafter: SuffixDrafter,
        live: Sequence[Any] = (),
    ) -> MemoryUse:
        kv = _live_bytes(states, live)
        snapshots = sum(_own_snapshot_bytes(state) for state in states)
        held = {id(a): a for state in states for a in _state_arrays(state)}
        shared = sum(int(a.nbytes) for a in _tail_arrays(branches) if id(a) in held)
        cached, corpus = branches.nbytes(), drafter.nbytes()
        total = kv + snapshots + cached - shared + corpus
        return MemoryUse(kv, snapshots, cached, corpus, total, self.max_bytes)


def _checked(max_bytes: int | None) -> int:
    if max_bytes is None:
        return default_budget_bytes()
    if not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"the memory budget must be a number of bytes >= 0, not {max_bytes!r}")
    return max_bytes


def _live_bytes(states: Iterable[SequenceState], live: Iterable[Any] = ()) -> int:
    held = sum(layer.nbytes() for state in states for layer in state.layers)
    return held + sum(int(part.nbytes()) for part in live)


def _own_snapshot_bytes(state: SequenceState) -> int:
    """Bytes the snapshots hold beyond the live layers (a snapshot of the current
    position may be the live arrays themselves)."""
    return state.nbytes() - sum(layer.nbytes() for layer in state.layers)


def _state_arrays(state: SequenceState) -> list[Any]:
    arrays = [a for layer in state.layers for a in layer.live_arrays()]
    for _store, _pos, snaps in state.snapshot_items():
        arrays += [a for snap in snaps for a in arrays_in(snap)]
    return arrays


def _tail_arrays(branches: BranchCache) -> list[Any]:
    """Each distinct array of the tails' snapshots (rows are copies, never shared)."""
    seen: dict[int, Any] = {}
    for tail in branches.tails.values():
        for snaps in tail.recurrent.values():
            for snap in snaps:
                for a in arrays_in(snap):
                    seen[id(a)] = a
    return list(seen.values())
