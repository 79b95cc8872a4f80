"""A prefill takes the snapshots due near a chunk's start from a recorded forward's tape
instead of ending the chunk there: turn boundaries a few tokens apart (a short reply, then
a question) cost one forward, not one each (on a hybrid each forward reads every weight;
the first message after a restart ran five). The snapshots land where they did, and a
truncate to each is served by it and exact."""

from __future__ import annotations

from typing import Any

import pytest

from engine.sequence import INNER_SNAPSHOT_ROWS, prefill, truncate
from engine.state import SnapshotPolicy
from tests.conftest import TinyModels
from tests.engine.test_state_property import StateModels, token_ids
from tests.engine.test_state_refusals import assert_exact

POLICY = SnapshotPolicy(stride=256, stride_capacity=8, marked_capacity=8)


@pytest.fixture(scope="module")
def models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> StateModels:
    return StateModels(tiny_models, tmp_path_factory.mktemp("inner_models"))


class Counting:
    """The model, counting its forwards."""

    def __init__(self, model: Any) -> None:
        self.model, self.rows = model, []

    def forward(self, token_ids: list[int], state: Any, logits: str = "last") -> Any:
        self.rows.append(len(token_ids))
        return self.model.forward(token_ids, state, logits)


@pytest.mark.parametrize("backend", ["numpy", "mlx"])
def test_near_boundaries_cost_one_forward_and_leave_their_snapshots(
    models: StateModels, backend: str
) -> None:
    model = models.get("hybrid", backend).model
    state = model.new_state(POLICY)
    prefill(model, state, token_ids(0, 20))
    marks = [27, 33, 38]  # a reply's end, a question's end, the generation prompt
    for position in marks:
        state.mark(position)  # ahead of the cursor: taken when reached
    counting = Counting(model)
    prefill(counting, state, token_ids(1, 25))
    assert counting.rows == [25]
    assert set(marks) <= set(state.snapshot_positions())
    for position in marks:
        assert state.plan_truncate(position) == position
    truncate(model, state, marks[0])
    assert_exact(model, state)


def test_a_far_boundary_still_ends_the_chunk(models: StateModels) -> None:
    model = models.get("hybrid").model
    state = model.new_state(POLICY)
    far = INNER_SNAPSHOT_ROWS + 10
    state.mark(far)
    counting = Counting(model)
    prefill(counting, state, token_ids(2, far + 5))
    assert counting.rows == [far, 5]
    assert far in state.snapshot_positions()
    truncate(model, state, far)
    assert_exact(model, state)
