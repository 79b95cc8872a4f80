"""Where a request resumes: one decision (`plan_resume`), one plan, one carry-out (`resume`).

A request's prompt can reuse computed state from:

- the live state: its common prefix with the prompt (an edit or a regenerate rewinds it);
- a branch tail: the rows of a sibling branch left earlier, appended at its fork;
- a saved state on disk: the conversation's state from the prompt cache, which
  replaces the live one when it reaches further into the prompt;
- nothing (fresh).

A layer that cannot rewind to the fork directly restores the nearest snapshot at or before
it and replays the tokens in between. Planning reads the sources and mutates nothing;
carrying a plan out keeps the tails it leaves in the branch cache, truncates, marks the
fork and appends the chosen tail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from engine.branch_cache import BranchCache, common_prefix
from engine.sequence import Forward, SequenceState, truncate


class Source(Enum):
    """Where the end of the reused prefix comes from."""

    LIVE = "live"
    BRANCH_TAIL = "branch tail"
    DISK = "disk"
    FRESH = "fresh"


@dataclass(frozen=True)
class ResumePlan:
    """How to bring a state to the longest reusable prefix of one prompt."""

    source: Source
    saved: SequenceState | None  # the state loaded from disk that replaces the live one
    keeps_live_whole: bool  # the live state goes whole to the branch cache as `saved` replaces it
    keeps_tail_past_fork: bool  # the resumed state's tokens past `fork` go to the branch cache
    fork: int  # the resumed state is truncated here: the common prefix, or the tail's fork
    replay_from: int  # the snapshot position the truncate restores before replaying to `fork`
    tail_id: int | None  # the branch tail appended at `fork`
    num_tail_rows: int  # how many of its rows

    @property
    def num_reused(self) -> int:
        """Prompt tokens whose state is reused rather than computed."""
        return self.replay_from + self.num_tail_rows

    @property
    def num_replayed(self) -> int:
        """Tokens recomputed to get from the restored snapshot to the fork."""
        return self.fork - self.replay_from


def plan_resume(
    live: SequenceState,
    ids: list[int],
    branches: BranchCache,
    saved: SequenceState | None = None,
) -> ResumePlan:
    """The plan for prompt `ids` given the live state, the branch cache and the state the
    prompt cache holds for this conversation (None: none, or the conversation is current)."""
    resumed, keeps_live_whole = live, False
    if saved is not None and common_prefix(saved.tokens, ids) > common_prefix(live.tokens, ids):
        resumed, keeps_live_whole = saved, live.offset > 0
    # at least the last prompt token is forwarded: its logits start the reply
    target = min(common_prefix(resumed.tokens, ids), len(ids) - 1)
    # keeping the live state whole happens first and may evict tails: those cannot be used
    evicted = branches.evicted_by_saving(live, 0) if keeps_live_whole else set()
    match = branches.best_match(resumed, ids[:-1], target, excluding=evicted)
    fork = branches.tails[match[0]].fork if match else target
    if match is not None:
        source = Source.BRANCH_TAIL
    elif resumed is saved:
        source = Source.DISK
    else:
        source = Source.LIVE if fork else Source.FRESH
    return ResumePlan(
        source=source,
        saved=resumed if resumed is saved else None,
        keeps_live_whole=keeps_live_whole,
        keeps_tail_past_fork=resumed.offset > fork,
        fork=fork,
        replay_from=resumed.plan_truncate(fork),
        tail_id=match[0] if match else None,
        num_tail_rows=match[1] if match else 0,
    )


def resume(
    model: Forward,
    live: SequenceState,
    plan: ResumePlan,
    branches: BranchCache,
    *,
    chunk_size: int,
    on_chunk: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> SequenceState:
    """Carry out `plan` (made for `live` and `branches` as they are); returns the state the
    request continues on, at `plan.fork + plan.num_tail_rows` tokens. The replay to the
    fork reports each chunk (`on_chunk(tokens replayed)`) and stops between chunks when
    `should_stop` says so: the state then holds exactly the tokens replayed, short of the
    fork, and no tail is appended."""
    state = live
    if plan.saved is not None:
        if plan.keeps_live_whole:
            branches.save_tail(live, 0)
        state = plan.saved
    if plan.keeps_tail_past_fork:
        branches.save_tail(state, plan.fork, keep=plan.tail_id)
    truncate(
        model, state, plan.fork, chunk_size=chunk_size, on_chunk=on_chunk, should_stop=should_stop
    )
    if state.offset < plan.fork:
        return state
    state.mark(plan.fork)
    if plan.tail_id is not None:
        branches.restore(state, plan.tail_id, plan.num_tail_rows)
    return state
