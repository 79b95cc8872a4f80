"""A speculative verify that crosses a snapshot position leaves the snapshot there, whatever
its outcome, so "a truncate replays at most `stride` tokens" holds inside drafted replies:
recurrent layers rebuild the state there from the verify tape, a sliding ring from the
rows it recorded, with no model pass. And how long a verify may be (`max_verify_rows`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine import events as ev
from engine.errors import StateError
from engine.sequence import SequenceState, prefill, truncate
from engine.state import UNBOUNDED_DEPTH, RecurrentState, SnapshotPolicy
from tests.conftest import TinyModels
from tests.engine.engine_runner import USERS, Runner, always_draft, build_models, greedy, user
from tests.engine.state_checks import host
from tests.engine.test_state_property import SLACK, StateModels, token_ids
from tests.engine.test_state_refusals import assert_exact

STRIDE = 8
POLICY = SnapshotPolicy(stride=STRIDE, stride_capacity=8, marked_capacity=4, sliding_slack=SLACK)


@pytest.fixture(scope="module")
def models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> StateModels:
    return StateModels(tiny_models, tmp_path_factory.mktemp("verify_models"))


def verified(model: Any, start: int, rows: int) -> tuple[SequenceState, Any]:
    """A state at `start` tokens with a recorded verify of `rows` rows forwarded."""
    state = model.new_state(POLICY)
    prefill(model, state, token_ids(0, start))
    cp = state.checkpoint(record=True)
    model.forward(token_ids(1, rows), state, logits="all")
    return state, cp


def assert_truncates_through(model: Any, state: SequenceState, n: int, snapshot: int) -> None:
    """Grown well past the ring, a truncate to n restores `snapshot` and is exact."""
    prefill(model, state, token_ids(2, 50 - state.offset))
    assert state.plan_truncate(n) == snapshot
    truncate(model, state, n)
    assert_exact(model, state)


@pytest.mark.parametrize("backend", ["numpy", "mlx"])
@pytest.mark.parametrize(
    ("kind", "rows"), [("hybrid", 7), ("sliding", 7), ("sliding", 8)]
)  # 8 rows: more than a sliding ring can rewind, so the ring comes from the tape alone
def test_a_committed_verify_leaves_the_stride_snapshot_inside_it(
    models: StateModels, kind: str, rows: int, backend: str
) -> None:
    model = models.get(kind, backend).model
    state, cp = verified(model, 30, rows)  # 30 -> 37 or 38: crosses 32
    state.commit(cp)
    assert state.snapshot_positions() == [8, 16, 24, 32]
    assert_truncates_through(model, state, 33, 32)  # replays 1 token (it was 9)


@pytest.mark.parametrize("backend", ["numpy", "mlx"])
@pytest.mark.parametrize("kind", ["hybrid", "sliding"])
def test_a_partly_accepted_verify_leaves_the_snapshots_it_keeps(
    models: StateModels, kind: str, backend: str
) -> None:
    model = models.get(kind, backend).model
    state, cp = verified(model, 30, 7)
    state.rollback_retaining(cp, 4)  # keeps 30..33: 32 is inside
    assert state.tokens[-4:] == token_ids(1, 4)
    assert state.snapshot_positions() == [8, 16, 24, 32]
    assert_exact(model, state)
    assert_truncates_through(model, state, 33, 32)

    state, cp = verified(model, 30, 3)
    state.rollback_retaining(cp, 1)  # keeps 30: 32 was never reached
    assert state.snapshot_positions() == [8, 16, 24]
    assert_exact(model, state)


def test_a_mark_inside_a_verify_is_taken_when_its_rows_are_kept(models: StateModels) -> None:
    model = models.get("hybrid").model
    state = model.new_state(POLICY)
    prefill(model, state, token_ids(0, 20))
    cp = state.checkpoint(record=True)
    assert state.mark(22)  # a turn boundary the verify will cross
    model.forward(token_ids(1, 5), state, logits="all")
    state.mark(state.offset)  # at the verify's end: its rows are not verified yet
    state.commit(cp)
    marked = [pos for store, pos, _ in state.snapshot_items() if store == "marked"]
    assert marked == [22, 25]
    prefill(model, state, token_ids(2, 4))
    assert state.plan_truncate(23) == 22
    truncate(model, state, 23)
    assert_exact(model, state)


@pytest.mark.parametrize("backend", ["numpy", "mlx"])
def test_rollback_retaining_keeps_the_one_fold_result_bit_for_bit(
    models: StateModels, backend: str
) -> None:
    """Stopping at a stride position on the way changes no bit of the kept state: the
    tape is folded in pieces, as one fold of the kept rows would."""
    model = models.get("hybrid", backend).model
    ops = model.ops
    state, cp = verified(model, 30, 7)
    expected = []
    for layer, snap in zip(state.layers, cp.layer_snaps, strict=True):
        if isinstance(layer, RecurrentState):
            assert layer.tape is not None
            conv_in = ops.concat(layer.tape.conv_in, axis=0)[:5]
            q, k, v, g, beta = (
                ops.concat([piece[i] for piece in layer.tape.qkvgb], axis=0)[:5] for i in range(5)
            )
            conv = ops.conv_state_after(snap[0], conv_in)
            _, ssm = ops.gated_delta_recurrent(q, k, v, g, beta, snap[1])
            expected.append((host(conv), host(ssm)))
    state.rollback_retaining(cp, 5)  # 35, past the snapshot at 32
    assert 32 in state.snapshot_positions()
    got = [(host(s.conv), host(s.ssm)) for s in state.layers if isinstance(s, RecurrentState)]
    assert len(got) == len(expected) == 3
    for (conv, ssm), (want_conv, want_ssm) in zip(got, expected, strict=True):
        assert np.array_equal(conv, want_conv) and np.array_equal(ssm, want_ssm)


def test_max_verify_rows_is_what_a_retaining_rollback_can_serve(models: StateModels) -> None:
    assert models.get("llama").model.new_state().max_verify_rows() == UNBOUNDED_DEPTH
    assert models.get("hybrid").model.new_state().max_verify_rows() == UNBOUNDED_DEPTH
    model = models.get("sliding").model
    limit = model.new_state(POLICY).max_verify_rows()
    assert limit == SLACK + 2  # keeps the pending token's row, drops up to slack + 1
    for start in (3, 30):  # before and after the ring has wrapped
        state, cp = verified(model, start, limit)
        state.rollback_retaining(cp, 1)
        assert_exact(model, state)
    state, cp = verified(model, 30, limit + 1)
    with pytest.raises(StateError, match="slack"):
        state.rollback_retaining(cp, 1)


def test_a_drafted_reply_keeps_its_stride_snapshots(
    tiny_models: TinyModels,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the engine: a regenerate on the hybrid drafts (lookup) most of its reply,
    and every stride position inside the reply still has its snapshot."""
    always_draft(monkeypatch)
    hybrid = build_models(tiny_models, tmp_path_factory)["hybrid"]
    policy = SnapshotPolicy(stride=STRIDE, stride_capacity=64)
    messages = (ev.Message("system", "You answer in one short sentence."), user(USERS[0]))
    settings = greedy("lookup", max_tokens=40)
    with Runner(snapshot_policy=policy) as runner:
        runner.load(hybrid)
        runner.generate(messages, settings)
        again = runner.generate(messages, settings)  # drafts the first reply
        assert again.stats is not None and again.stats.accepted >= 16
        session = runner.engine.session
        assert session is not None
        end = session.state.offset
        prompt = end - len(again.token_ids) + 1  # the last token is not forwarded
        strides = [p for p in session.state.snapshot_positions() if p % STRIDE == 0]
        assert [p for p in strides if p > prompt] == list(
            range((prompt // STRIDE + 1) * STRIDE, end + 1, STRIDE)
        )
