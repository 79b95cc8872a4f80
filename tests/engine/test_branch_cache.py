"""The branch cache on a hybrid model: a restored tail brings back the turn-boundary
snapshots it held, so a later edit inside it resumes from them, and the logits after
the restore equal a fresh prefill; the eviction it forecasts is the one saving does."""

from __future__ import annotations

import numpy as np
import pytest

from engine.branch_cache import BranchCache
from engine.config import EngineConfig
from engine.loader import load_model
from engine.sequence import prefill, truncate
from tests.hybrid_models import make_hybrid_dir


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    path = tmp_path_factory.mktemp("branch-hybrid")
    make_hybrid_dir(path, layout="hf")
    return load_model(path, EngineConfig(backend="numpy"))


def test_restored_tail_brings_back_its_snapshots(hybrid) -> None:
    model = hybrid.model
    tokens = [int(t) for t in np.random.default_rng(0).integers(3, 200, 90)]
    fork, marks = 20, [35, 52, 70]
    state = model.new_state()
    prefill(model, state, tokens[:fork], chunk_size=16)
    state.mark(fork)
    for m in marks:
        state.mark(m)
    prefill(model, state, tokens[fork:], chunk_size=16)
    assert set(marks) <= set(state.snapshot_positions())

    cache = BranchCache()
    cache.save_tail(state, fork)
    truncate(model, state, fork)  # an edit at the fork
    prefill(model, state, [7, 8, 9], chunk_size=16)  # the edited branch
    truncate(model, state, fork)
    assert not set(marks) & set(state.snapshot_positions())

    match = cache.best_match(state, tokens, state.offset)
    assert match is not None and match[1] == len(tokens) - fork
    cache.restore(state, *match)
    assert state.tokens == tokens
    assert set(marks) <= set(state.snapshot_positions())

    # an edit inside the restored tail now rewinds to the snapshot at 52, not the fork
    assert state.plan_truncate(60) == 52
    got = np.array(model.forward([5], state))[-1]
    fresh = model.new_state()
    want = np.array(prefill(model, fresh, [*tokens, 5], chunk_size=16))[-1]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_eviction_forecast_is_what_saving_evicts(hybrid) -> None:
    model = hybrid.model
    rng = np.random.default_rng(1)
    branches = [[int(t) for t in rng.integers(3, 200, n)] for n in (12, 30, 20, 45)]
    states = []
    for branch in branches:
        state = model.new_state()
        prefill(model, state, branch, chunk_size=16)
        states.append(state)
    sizes = BranchCache()
    for state in states:
        sizes.save_tail(state, 0)
    total = sizes.nbytes()
    for budget in range(0, total + 1, max(1, total // 23)):
        cache = BranchCache(budget)
        for state in states[:-1]:
            cache.save_tail(state, 0)
        held = set(cache.tails)
        forecast = cache.evicted_by_saving(states[-1], 0)
        assert set(cache.tails) == held  # forecasting changes nothing
        cache.save_tail(states[-1], 0)
        assert forecast == held - set(cache.tails)


def test_a_longer_tail_replaces_the_one_it_contains_and_keeps_its_restore_points(hybrid) -> None:
    """The same branch saved again after it grew (a reply went on) is one tail, not two,
    and it can still be restored where the shorter one could (its end snapshot)."""
    model = hybrid.model
    tokens = [int(t) for t in np.random.default_rng(2).integers(3, 200, 90)]
    fork = 20
    state = model.new_state()
    prefill(model, state, tokens[:60], chunk_size=16)
    cache = BranchCache()
    cache.save_tail(state, fork)
    cache.save_tail(state, fork)  # the same tail again: nothing new is stored
    assert len(cache.tails) == 1
    (short,) = cache.tails.values()
    assert 40 in short.recurrent  # its end, 60 - 20
    prefill(model, state, tokens[60:], chunk_size=16)
    cache.save_tail(state, fork)
    (tail,) = cache.tails.values()
    assert tail.tokens == tokens[fork:] and {40, 70} <= set(tail.recurrent)
    truncate(model, state, fork)
    prefill(model, state, [7, 8, 9], chunk_size=16)  # another branch
    truncate(model, state, fork)
    match = cache.best_match(state, tokens[:60] + [5], state.offset)
    assert match is not None and match[1] == 40  # the shorter tail's end is restorable
    cache.restore(state, *match)
    assert state.tokens == tokens[:60]
    got = np.array(model.forward([5], state))[-1]
    want = np.array(prefill(model, model.new_state(), [*tokens[:60], 5], chunk_size=16))[-1]
    np.testing.assert_allclose(got, want, atol=1e-4)
