"""Resume planning on a hybrid model: a plan changes nothing until it is carried out, then
the state sits at exactly the prefix the plan names and continues like a fresh prefill; a
saved state that replaces the live one cannot resume from a tail that keeping the live
state evicts (the branch cache forecasts its own eviction)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.branch_cache import BranchCache
from engine.config import EngineConfig
from engine.loader import load_model
from engine.resume import ResumePlan, Source, plan_resume, resume
from engine.sequence import SequenceState, prefill
from tests.hybrid_models import make_hybrid_dir

PROBE = 5
CHUNK = 16


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("resume-hybrid")
    make_hybrid_dir(path, layout="hf")
    return load_model(path, EngineConfig(backend="numpy")).runner


def tokens(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 200, n)]


def grown(runner: Any, *pieces: list[int]) -> SequenceState:
    """A state holding the pieces, with a turn-boundary snapshot where each one ends."""
    state = runner.new_state()
    for piece in pieces:
        prefill(runner, state, piece, chunk_size=CHUNK)
        state.mark(state.offset)
    return state


def fingerprint(state: SequenceState, branches: BranchCache) -> tuple:
    return (
        list(state.tokens),
        state.epoch,
        state.snapshot_positions(),
        list(branches.tails),
        branches.nbytes(),
    )


def carry_out(runner: Any, live: SequenceState, plan: ResumePlan, branches: BranchCache) -> Any:
    state = resume(runner, live, plan, branches, chunk_size=CHUNK)
    assert state.offset == plan.fork + plan.num_tail_rows
    assert plan.num_reused + plan.num_replayed == plan.fork + plan.num_tail_rows
    return state


def next_logits_match_a_fresh_prefill(runner: Any, state: SequenceState) -> None:
    held = list(state.tokens)
    got = np.array(runner.forward([PROBE], state))[-1]
    want = np.array(prefill(runner, runner.new_state(), [*held, PROBE], chunk_size=CHUNK))[-1]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_a_plan_changes_nothing_and_resume_reaches_it(runner: Any) -> None:
    prefix, left, edited = tokens(0, 24), tokens(1, 30), tokens(2, 12)
    live = grown(runner, prefix, left)
    branches = BranchCache()
    ids = [*prefix, *edited]

    before = fingerprint(live, branches)
    plan = plan_resume(live, ids, branches)
    assert fingerprint(live, branches) == before
    assert plan.source is Source.LIVE and plan.saved is None
    assert (plan.fork, plan.replay_from, plan.num_reused) == (24, 24, 24)
    assert plan.keeps_tail_past_fork and plan.tail_id is None

    state = carry_out(runner, live, plan, branches)
    assert state is live and state.tokens == prefix
    assert len(branches.tails) == 1  # the branch left behind
    prefill(runner, state, edited, chunk_size=CHUNK)

    back = [*prefix, *left, PROBE]  # back to the first branch: its tail comes back
    plan = plan_resume(state, back, branches)
    assert plan.source is Source.BRANCH_TAIL and plan.tail_id is not None
    assert (plan.fork, plan.num_tail_rows, plan.num_reused) == (24, 30, 54)
    state = carry_out(runner, state, plan, branches)
    assert state.tokens == [*prefix, *left]
    next_logits_match_a_fresh_prefill(runner, state)


def test_nothing_in_common_is_a_fresh_start(runner: Any) -> None:
    live, branches = grown(runner, tokens(3, 20)), BranchCache()
    plan = plan_resume(live, [1, *tokens(4, 10)], branches)  # prompt tokens here are >= 3
    assert plan.source is Source.FRESH
    assert (plan.fork, plan.num_reused, plan.num_replayed) == (0, 0, 0)
    assert carry_out(runner, live, plan, branches).offset == 0


@pytest.mark.parametrize("tight", [False, True])
def test_a_saved_state_resumes_from_a_tail_the_switch_leaves(runner: Any, tight: bool) -> None:
    prefix, sibling, current = tokens(5, 20), tokens(6, 30), tokens(7, 10)
    saved = grown(runner, prefix, current)  # the conversation entered, as saved on disk
    live = grown(runner, tokens(8, 25))  # the conversation left
    sizes = BranchCache()
    sizes.save_tail(live, 0)
    sizes.save_tail(grown(runner, prefix, sibling), len(prefix))
    live_bytes, sibling_bytes = (tail.nbytes for tail in sizes.tails.values())
    # tight: room for the sibling's tail or the live state's, not both
    budget = sibling_bytes + (live_bytes - 1 if tight else live_bytes)
    branches = BranchCache(budget)
    branches.save_tail(grown(runner, prefix, sibling), len(prefix))
    (sibling_id,) = branches.tails
    assert branches.evicted_by_saving(live, 0) == ({sibling_id} if tight else set())

    ids = [*prefix, *sibling, PROBE]
    before = fingerprint(live, branches), fingerprint(saved, branches)
    plan = plan_resume(live, ids, branches, saved)
    assert (fingerprint(live, branches), fingerprint(saved, branches)) == before
    assert plan.saved is saved and plan.keeps_live_whole and plan.fork == len(prefix)
    if tight:  # keeping the live state evicts the sibling first, as it always did
        assert plan.source is Source.DISK and plan.num_reused == len(prefix)
    else:
        assert plan.source is Source.BRANCH_TAIL and plan.tail_id == sibling_id
        assert plan.num_reused == len(prefix) + len(sibling)

    state = carry_out(runner, live, plan, branches)
    assert state is saved
    assert (sibling_id in branches.tails) is not tight
    if tight:  # the live state's tail made room by evicting the sibling, and stays
        assert any(tail.tokens == live.tokens for tail in branches.tails.values())
    next_logits_match_a_fresh_prefill(runner, state)
