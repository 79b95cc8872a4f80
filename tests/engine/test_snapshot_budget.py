"""The snapshot stores under a byte budget (`SnapshotPolicy.max_snapshot_bytes`,
`SequenceState.set_snapshot_budget`): the snapshot at the lowest position goes first, a
truncate at or past the oldest one kept still replays at most `stride` tokens, and one
further back replays exactly from an older snapshot or position 0. Bytes count an array
once however many snapshots and live layers hold it.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.sequence import SequenceState, prefill, truncate
from engine.state import SnapshotPolicy
from tests.conftest import TinyModels
from tests.engine.test_state_property import StateModels, token_ids
from tests.engine.test_state_refusals import assert_exact

POLICY = SnapshotPolicy(stride=8, sliding_slack=4)


@pytest.fixture(scope="module")
def models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> StateModels:
    return StateModels(tiny_models, tmp_path_factory.mktemp("budget_models"))


def one_snapshot_bytes(model: Any) -> int:
    state = model.new_state(POLICY)
    prefill(model, state, token_ids(0, 8))
    assert state.snapshot_positions() == [8]
    return state.snapshot_nbytes()


@pytest.mark.parametrize("kind", ["hybrid", "sliding"])
def test_over_the_budget_the_lowest_positions_go_first(models: StateModels, kind: str) -> None:
    model = models.get(kind).model
    per_snapshot = one_snapshot_bytes(model)
    budget = 5 * per_snapshot // 2  # room for two
    state = model.new_state(SnapshotPolicy(stride=8, sliding_slack=4, max_snapshot_bytes=budget))
    assert state.snapshot_budget == budget
    state.mark(21)
    prefill(model, state, token_ids(0, 50))  # 8, 16, 21 (marked), 24, ..., 48
    assert state.snapshot_positions() == [40, 48]
    assert state.snapshot_nbytes() == 2 * per_snapshot <= budget
    for n in range(40, 51):  # at or past the oldest kept: at most a stride replayed
        assert n - state.plan_truncate(n) < 8
    assert state.plan_truncate(30) == 0  # further back: the exact fallback
    truncate(model, state, 30)
    assert_exact(model, state)


def test_lowering_the_budget_evicts_now_across_both_stores(models: StateModels) -> None:
    model = models.get("hybrid").model
    per_snapshot = one_snapshot_bytes(model)
    state = model.new_state(POLICY)
    state.mark(44)
    prefill(model, state, token_ids(0, 50))
    assert state.snapshot_positions() == [8, 16, 24, 32, 40, 44, 48]
    state.set_snapshot_budget(3 * per_snapshot)
    assert state.snapshot_positions() == [40, 44, 48]
    assert [(store, pos) for store, pos, _ in state.snapshot_items()] == [
        ("stride", 40),
        ("stride", 48),
        ("marked", 44),
    ]
    state.set_snapshot_budget(0)
    assert state.snapshot_positions() == [] and state.snapshot_nbytes() == 0
    assert state.plan_truncate(45) == 0
    truncate(model, state, 45)
    assert_exact(model, state)
    state.set_snapshot_budget(None)  # by count again: a replay takes them again
    truncate(model, state, 44)
    assert state.snapshot_positions() == [8, 16, 24, 32, 40]


def test_a_shared_position_is_one_snapshot(models: StateModels) -> None:
    """A mark on a stride position shares the stride snapshot: evicting one of the two
    entries frees nothing, so the budget counts it once."""
    model = models.get("sliding").model
    per_snapshot = one_snapshot_bytes(model)
    state = model.new_state(SnapshotPolicy(stride=8, sliding_slack=4))
    state.mark(16)
    prefill(model, state, token_ids(0, 20))
    assert [(s, p) for s, p, _ in state.snapshot_items()] == [
        ("stride", 8),
        ("stride", 16),
        ("marked", 16),
    ]
    assert state.snapshot_nbytes() == 2 * per_snapshot
    state.set_snapshot_budget(per_snapshot)
    assert [(s, p) for s, p, _ in state.snapshot_items()] == [("stride", 16), ("marked", 16)]


def test_nbytes_counts_what_the_live_state_shares_with_a_snapshot_once(
    models: StateModels,
) -> None:
    """Right after a snapshot a recurrent layer's live arrays ARE the snapshot's."""
    model = models.get("hybrid").model
    state = model.new_state(POLICY)
    prefill(model, state, token_ids(0, 16))
    assert state.snapshot_positions() == [8, 16]
    live = sum(layer.nbytes() for layer in state.layers)
    shared = sum(layer.nbytes() for layer in state.layers if layer.needs_snapshots())
    assert state.nbytes() == live + state.snapshot_nbytes() - shared
    model.forward([3], state)  # the live arrays move on: nothing is shared any more
    assert state.nbytes() == sum(layer.nbytes() for layer in state.layers) + (
        state.snapshot_nbytes()
    )


def test_a_budget_is_validated() -> None:
    with pytest.raises(ValueError, match="max_snapshot_bytes"):
        SnapshotPolicy(max_snapshot_bytes=-1)
    state = SequenceState(ops=None, layers=[])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        state.set_snapshot_budget(-5)
    assert state.snapshot_budget is None
