"""Marks (turn-boundary snapshots) say whether they took, and stale ones do not survive an
edit; KV buffers grow geometrically, and `reserve` gives exactly the capacity asked for.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import StateError
from engine.sequence import prefill, truncate
from engine.state import FullKV, SnapshotPolicy
from kernels.ops_numpy import NumpyOps
from tests.conftest import TinyModels
from tests.engine.test_state_property import StateModels, token_ids
from tests.engine.test_state_refusals import assert_exact

POLICY = SnapshotPolicy(stride=64, sliding_slack=4)  # no stride snapshot in the way


@pytest.fixture(scope="module")
def models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> StateModels:
    return StateModels(tiny_models, tmp_path_factory.mktemp("mark_models"))


@pytest.mark.parametrize("kind", ["hybrid", "sliding"])
def test_mark_says_whether_a_truncate_there_is_served(models: StateModels, kind: str) -> None:
    model = models.get(kind).model
    state = model.new_state(POLICY)
    prefill(model, state, token_ids(0, 20))
    assert state.mark(20)  # here: taken now
    assert state.mark(30)  # ahead: taken when reached
    prefill(model, state, token_ids(1, 15))
    assert state.snapshot_positions() == [20, 30]
    assert state.mark(20)  # behind, but held
    assert not state.mark(25)  # behind and not held: the state cannot go back for it
    assert state.snapshot_positions() == [20, 30]
    with pytest.raises(StateError, match="-1"):
        state.mark(-1)


def test_a_mark_on_a_held_stride_snapshot_outlives_the_stride_ring(models: StateModels) -> None:
    """The session marks turn boundaries after resuming, often behind the cursor: one that
    a stride snapshot holds joins the marked store, sharing its arrays."""
    model = models.get("hybrid").model
    state = model.new_state(SnapshotPolicy(stride=8, stride_capacity=2, marked_capacity=2))
    prefill(model, state, token_ids(0, 20))
    bytes_before = state.snapshot_nbytes()
    assert state.mark(8)
    assert state.snapshot_nbytes() == bytes_before  # no copy
    prefill(model, state, token_ids(1, 20))  # the stride ring moves on to 32, 40
    assert state.snapshot_positions() == [8, 32, 40]
    assert state.plan_truncate(10) == 8
    truncate(model, state, 10)
    assert_exact(model, state)


def test_full_attention_serves_every_mark(models: StateModels) -> None:
    model = models.get("llama").model
    state = model.new_state(POLICY)
    prefill(model, state, token_ids(0, 20))
    assert state.mark(5) and state.mark(20) and state.mark(40)
    assert state.snapshot_positions() == []


@pytest.mark.parametrize("rewind", ["truncate", "rollback", "rollback_retaining"])
def test_pending_marks_do_not_survive_a_rewind(models: StateModels, rewind: str) -> None:
    """A mark ahead of the cursor belongs to the tokens the caller meant to append; after
    a rewind those are unknown, and a snapshot there would be one nobody asked for."""
    model = models.get("hybrid").model
    state = model.new_state(POLICY)
    prefill(model, state, token_ids(0, 30))
    cp = state.checkpoint(record=rewind == "rollback_retaining")
    model.forward(token_ids(1, 3), state, logits="all")
    state.mark(37)
    if rewind == "truncate":
        truncate(model, state, 20)
    elif rewind == "rollback":
        state.rollback(cp)
    else:
        state.rollback_retaining(cp, 1)
    assert state.next_snapshot_position() == 64  # not 37: a chunk would stop there
    prefill(model, state, token_ids(2, 45 - state.offset))
    assert 37 not in state.snapshot_positions()
    assert_exact(model, state)


def full_kv() -> FullKV:
    return FullKV(NumpyOps(), num_kv_heads=1, head_dim=2)


def test_kv_buffers_grow_geometrically() -> None:
    """Appending row by row to 6,000 positions copies O(n) rows, not O(n^2)."""
    kv = full_kv()
    row = np.ones((1, 1, 2), dtype=np.float32)
    capacities, copied = [0], 0
    for _ in range(6000):
        if kv.length == kv.capacity():
            copied += kv.length  # what a reallocation carries over
        kv.append(row, row)
        if kv.capacity() != capacities[-1]:
            capacities.append(kv.capacity())
    assert all(cap % 256 == 0 for cap in capacities)
    assert len(capacities) <= 10  # fixed 256-row steps took 24
    assert copied <= 3 * 6000  # fixed steps copied 66,048 rows
    assert kv.capacity() < 1.5 * 6000 + 256


def test_reserve_gives_exactly_the_capacity_asked_for() -> None:
    """The fused CUDA step brings every layer to one capacity of its choosing."""
    kv = full_kv()
    for needed, capacity in ((1, 256), (1024, 1024), (3000, 3072), (2048, 2048)):
        kv.reserve(needed)
        assert kv.capacity() == capacity
