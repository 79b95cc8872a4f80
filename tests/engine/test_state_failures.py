"""A forward or a tape replay that raises half-way (out of memory, a bug) leaves the state
exactly as it was before the call: the same tokens, rows, snapshots and checkpoints, the
next logits equal to a fresh prefill's, and an open verify still usable. Only where the
undo itself cannot be trusted is the state poisoned (test_state_refusals.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from engine.errors import StateError
from engine.sequence import SequenceState, prefill, truncate
from tests.conftest import TinyModels
from tests.engine.state_checks import FORWARD_SITES, SimulatedOOM, forward_site, raise_oom
from tests.engine.state_reference import assert_last_logits_exact
from tests.engine.test_state_property import (
    POLICIES,
    StateModels,
    assert_unchanged,
    capture,
    token_ids,
)
from tests.engine.test_state_refusals import assert_exact, grown

KINDS = ["llama", "sliding", "hybrid"]


@pytest.fixture(scope="module")
def models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> StateModels:
    return StateModels(tiny_models, tmp_path_factory.mktemp("failure_models"))


@contextmanager
def failing(monkeypatch: pytest.MonkeyPatch, target: Any, name: str) -> Iterator[None]:
    """`target.name` raises while the block runs."""
    with monkeypatch.context() as patch:
        patch.setattr(target, name, raise_oom)
        yield


def assert_same_after(
    model: Any, state: SequenceState, call: Callable[[], Any], patch: pytest.MonkeyPatch, site: Any
) -> None:
    """`call` raises SimulatedOOM with `site` (target, name) broken, and the state is
    exactly as before it."""
    before = capture(state)
    with failing(patch, *site), pytest.raises(SimulatedOOM):
        call()
    assert not state.is_poisoned
    assert_unchanged(before, state)
    assert_exact(model, state)


@pytest.mark.parametrize("site", FORWARD_SITES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_prefill_changes_nothing(
    models: StateModels, kind: str, site: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = models.get(kind).model
    state = grown(models.get(kind), kind, 30)  # stride 8: snapshots at 8, 16, 24
    cp = state.checkpoint()  # armed, as a turn's rollback point would be
    snapshots = state.snapshot_positions()
    ids = token_ids(1, 12)
    forward = lambda: model.forward(ids, state, logits="none")  # noqa: E731
    assert_same_after(model, state, forward, monkeypatch, forward_site(model, site))
    assert state.snapshot_positions() == snapshots
    prefill(model, state, ids)  # the retry succeeds and takes the snapshot due at 40
    assert state.offset == 42
    assert state.needs_snapshots == (40 in state.snapshot_positions())
    assert_exact(model, state)
    if kind != "sliding":  # a ring rolls back at most its slack (12 rows here)
        state.rollback(cp)  # the checkpoint armed before the failure is still exact
        assert state.tokens == token_ids(0, 30)
        assert_exact(model, state)


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_chunk_keeps_the_chunks_before_it(
    models: StateModels, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefill stops at snapshot positions: the chunks before the failed one stay."""
    model = models.get(kind).model
    state = model.new_state(POLICIES[kind])
    real = model.layers[0].mlp
    calls = 0

    def second_chunk_fails(x: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise SimulatedOOM("out of memory (simulated)")
        return real(x)

    ids = token_ids(2, 20)
    with monkeypatch.context() as patch:
        patch.setattr(model.layers[0], "mlp", second_chunk_fails)
        with pytest.raises(SimulatedOOM):
            prefill(model, state, ids, chunk_size=5)
    assert state.tokens == ids[:5] and not state.is_poisoned
    assert_exact(model, state)
    prefill(model, state, ids[5:], chunk_size=5)
    assert_exact(model, state)


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_decode_step_changes_nothing(
    models: StateModels, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = models.get(kind).model
    state = grown(models.get(kind), kind, 23)
    site = (model.layers[-1], "mlp")  # the step to position 24
    assert_same_after(model, state, lambda: model.forward([5], state), monkeypatch, site)
    assert_last_logits_exact(model, state, model.forward([5], state), "the retried step")
    assert state.needs_snapshots == (24 in state.snapshot_positions())


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_verify_keeps_the_recording_open_and_exact(
    models: StateModels, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = models.get(kind).model
    state = grown(models.get(kind), kind, 22)
    cp = state.checkpoint(record=True)
    draft = token_ids(3, 4)  # 22 -> 26 crosses the stride position 24
    verify = lambda: model.forward(draft, state, logits="all")  # noqa: E731
    assert_same_after(model, state, verify, monkeypatch, (model.layers[-1], "mlp"))
    assert state.recording is cp
    verified = model.forward(draft, state, logits="all")  # the retry, same recording
    assert_last_logits_exact(model, state, verified, "verify")
    state.rollback_retaining(cp, 3)
    assert state.tokens == [*token_ids(0, 22), *draft[:3]]
    assert state.needs_snapshots == (24 in state.snapshot_positions())
    assert_exact(model, state)


def test_a_failed_tape_replay_leaves_the_verify_open(
    models: StateModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay of the kept rows runs before any cursor moves (it used to trim the KV
    layer first and leave it short of the recurrent ones)."""
    model = models.get("hybrid").model
    state = grown(models.get("hybrid"), "hybrid", 22)
    cp = state.checkpoint(record=True)
    model.forward(token_ids(4, 6), state, logits="all")
    before = capture(state)
    real = model.ops.gated_delta_recurrent
    calls = 0

    def third_replay_fails(*args: Any) -> Any:  # after some layers' replays succeeded
        nonlocal calls
        calls += 1
        if calls == 3:
            raise SimulatedOOM("out of memory (simulated)")
        return real(*args)

    with monkeypatch.context() as patch:
        patch.setattr(model.ops, "gated_delta_recurrent", third_replay_fails)
        with pytest.raises(SimulatedOOM):
            state.rollback_retaining(cp, 3)
    assert_unchanged(before, state)
    assert state.recording is cp
    state.rollback_retaining(cp, 3)  # the retry
    assert state.offset == 25 and 24 in state.snapshot_positions()
    assert_exact(model, state)


@pytest.mark.parametrize("kind", ["sliding", "hybrid"])
def test_a_failed_replay_of_a_commit_leaves_the_verify_open(
    models: StateModels, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full accept over a stride position rebuilds the snapshot there from the tape;
    when that fails the commit is refused as a whole and can be retried."""
    model = models.get(kind).model
    state = grown(models.get(kind), kind, 22)
    cp = state.checkpoint(record=True)
    model.forward(token_ids(5, 4), state, logits="all")
    site = (model.ops, "write_rows" if kind == "sliding" else "conv_state_after")
    assert_same_after(model, state, lambda: state.commit(cp), monkeypatch, site)
    state.commit(cp)
    assert 24 in state.snapshot_positions() and not state.is_recording
    truncate(model, state, 25)
    assert state.plan_truncate(24) == 24
    assert_exact(model, state)


def test_a_failed_snapshot_at_a_forwards_end_undoes_the_forward(
    models: StateModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot due where a chunk ends is taken before its rows are committed: when
    copying the ring runs out of memory the chunk is undone whole, so a retry appends it
    once (the rows used to be kept while the caller saw the failure)."""
    model = models.get("sliding").model
    state = grown(models.get("sliding"), "sliding", 20)
    site = (model.ops, "snapshot")
    forward = lambda: model.forward(token_ids(1, 4), state)  # noqa: E731  # ends on 24
    assert_same_after(model, state, forward, monkeypatch, site)
    forward()
    assert state.offset == 24 and 24 in state.snapshot_positions()
    assert_exact(model, state)


def test_a_failed_snapshot_at_a_verifys_end_leaves_the_verify_open(
    models: StateModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = models.get("sliding").model
    state = grown(models.get("sliding"), "sliding", 20)
    cp = state.checkpoint(record=True)
    model.forward(token_ids(1, 4), state, logits="all")  # ends on 24
    assert_same_after(model, state, lambda: state.commit(cp), monkeypatch, (model.ops, "snapshot"))
    state.commit(cp)
    assert 24 in state.snapshot_positions() and not state.is_recording


def test_a_failed_restore_refuses_until_reset(
    models: StateModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restoring a ring copies it: if that fails with some layers restored, the state
    refuses every call (StateError) rather than answer from mixed positions."""
    model = models.get("sliding").model
    state = grown(models.get("sliding"), "sliding", 30)
    assert state.plan_truncate(17) == 16
    real = model.ops.snapshot
    calls = 0

    def second_copy_fails(x: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:  # the first layer's keys and values are back, the second's not
            raise SimulatedOOM("out of memory (simulated)")
        return real(x)

    with monkeypatch.context() as patch:
        patch.setattr(model.ops, "snapshot", second_copy_fails)
        with pytest.raises(SimulatedOOM):
            truncate(model, state, 17)
    assert state.is_poisoned
    with pytest.raises(StateError, match="failed forward"):
        state.plan_truncate(5)
    state.reset()
    prefill(model, state, token_ids(0, 17))
    assert_exact(model, state)
