"""Every operation the state cannot serve exactly is refused with StateError and leaves the
state as it was (tokens, layer lengths and arrays, checkpoint validity, next logits), or
takes an explicit exact fallback; and the snapshot stores hold what they claim to.

"Next logits" here come from a probe on a deep copy, so taking them changes nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from engine.errors import StateError
from engine.kv_state import dtype_name
from engine.loader import LoadedModel
from engine.sequence import SequenceState, prefill, truncate
from engine.state import SnapshotPolicy
from tests.conftest import TinyModels
from tests.engine.state_reference import assert_close, assert_rows_match, fresh_prefill
from tests.engine.test_state_property import (
    POLICIES,
    SLACK,
    WINDOW,
    StateModels,
    assert_unchanged,
    capture,
    rows,
    token_ids,
)

KINDS = ["llama", "sliding", "hybrid"]
PROBE = 7


@pytest.fixture(scope="module")
def models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> StateModels:
    return StateModels(tiny_models, tmp_path_factory.mktemp("refusal_models"))


def grown(loaded: LoadedModel, kind: str, n: int, policy: SnapshotPolicy | None = None) -> Any:
    state = loaded.model.new_state(policy or POLICIES[kind])
    prefill(loaded.model, state, token_ids(0, n))
    return state


def next_logits(model: Any, state: SequenceState) -> np.ndarray:
    clone = copy.deepcopy(state, {id(state.ops): state.ops})  # ops hold MLX dtypes
    return rows(model.forward([PROBE], clone, logits="last"))[-1]


def assert_refused(model: Any, state: SequenceState, call: Callable[[], Any], match: str) -> None:
    logits = next_logits(model, state)
    before = capture(state)
    with pytest.raises(StateError, match=match):
        call()
    assert_unchanged(before, state)
    assert np.array_equal(next_logits(model, state), logits)


def assert_exact(model: Any, state: SequenceState) -> None:
    fresh, want = fresh_prefill(model, state.policy, [*state.tokens, PROBE])
    assert_close(model, next_logits(model, state), want, f"after {state.offset} tokens")
    assert_rows_match(model, state, fresh)


@pytest.mark.parametrize("kind", KINDS)
def test_truncate_beyond_the_end(models: StateModels, kind: str) -> None:
    loaded = models.get(kind)
    state = grown(loaded, kind, 20)
    for n in (21, -1):
        assert_refused(loaded.model, state, lambda n=n: truncate(loaded.model, state, n), "20")


@pytest.mark.parametrize("kind", KINDS)
def test_stale_checkpoint(models: StateModels, kind: str) -> None:
    model = models.get(kind).model
    state = grown(models.get(kind), kind, 20)
    cp = state.checkpoint()
    model.forward(token_ids(1, 3), state)
    state.rollback(cp)
    model.forward(token_ids(2, 3), state)
    assert_refused(model, state, lambda: state.rollback(cp), "stale")  # consumed
    cp = state.checkpoint()
    truncate(model, state, 12)
    model.forward(token_ids(3, 10), state)
    assert_refused(model, state, lambda: state.rollback(cp), "stale")  # truncated since
    assert_exact(model, state)


@pytest.mark.parametrize("kind", KINDS)
def test_retaining_more_rows_than_verified(models: StateModels, kind: str) -> None:
    model = models.get(kind).model
    state = grown(models.get(kind), kind, 20)
    cp = state.checkpoint(record=True)
    model.forward(token_ids(1, 4), state, logits="all")
    for keep in (5, -1):
        assert_refused(model, state, lambda k=keep: state.rollback_retaining(cp, k), "rows")
    state.rollback_retaining(cp, 2)  # the refusal left the verify intact: a retry works
    assert state.offset == 22
    assert_exact(model, state)


@pytest.mark.parametrize("kind", KINDS)
def test_retaining_without_a_recorded_checkpoint(models: StateModels, kind: str) -> None:
    model = models.get(kind).model
    state = grown(models.get(kind), kind, 20)
    cp = state.checkpoint()  # not recorded: no tape
    model.forward(token_ids(1, 4), state, logits="all")
    assert_refused(model, state, lambda: state.rollback_retaining(cp, 2), "recorded")
    state.rollback(cp)
    recorded = state.checkpoint(record=True)
    model.forward(token_ids(2, 3), state, logits="all")
    state.commit(recorded)  # consumed: its tape is gone
    assert_refused(model, state, lambda: state.rollback_retaining(recorded, 1), "recorded")
    assert_exact(model, state)


@pytest.mark.parametrize("kind", KINDS)
def test_a_second_recorded_checkpoint_while_one_is_open(models: StateModels, kind: str) -> None:
    model = models.get(kind).model
    state = grown(models.get(kind), kind, 10)
    cp = state.checkpoint(record=True)
    model.forward(token_ids(1, 3), state, logits="all")
    assert_refused(model, state, lambda: state.checkpoint(record=True), "still open")
    state.rollback_retaining(cp, 1)
    assert_exact(model, state)


@pytest.mark.parametrize("kind", KINDS)
def test_stacked_rollbacks(models: StateModels, kind: str) -> None:
    """The contract: any rewind (rollback, rollback_retaining, truncate) consumes every
    checkpoint taken before it, so rolling back to one of those is refused; a commit
    rewinds nothing, so an outer checkpoint stays valid and exact across it."""
    model = models.get(kind).model
    state = grown(models.get(kind), kind, 20)
    outer = state.checkpoint()
    model.forward(token_ids(1, 2), state)
    inner = state.checkpoint(record=True)
    model.forward(token_ids(2, 2), state, logits="all")
    state.rollback_retaining(inner, 1)
    assert_refused(model, state, lambda: state.rollback(outer), "stale")
    assert state.offset == 23
    assert_exact(model, state)

    outer = state.checkpoint()
    model.forward(token_ids(3, 2), state)
    inner = state.checkpoint(record=True)
    model.forward(token_ids(4, 2), state, logits="all")
    state.commit(inner)
    state.rollback(outer)  # across a commit: exact
    assert state.offset == 23
    assert_exact(model, state)

    first = state.checkpoint()
    model.forward(token_ids(5, 2), state)
    second = state.checkpoint()
    model.forward(token_ids(6, 2), state)
    state.rollback(first)  # skipping over the second: exact
    assert_refused(model, state, lambda: state.rollback(second), "stale")
    assert_exact(model, state)


def test_sliding_rewind_deeper_than_the_slack(models: StateModels) -> None:
    """rollback refuses a rewind the ring cannot serve; truncate serves it exactly from the
    nearest snapshot, a mark, or (explicit fallback) by replaying from position 0."""
    loaded = models.get("sliding")
    model = loaded.model
    ids = token_ids(0, 30)
    stride8 = POLICIES["sliding"]
    no_snapshots = SnapshotPolicy(stride=8, stride_capacity=0, marked_capacity=0, sliding_slack=4)
    for policy, expected_start in ((stride8, 8), (no_snapshots, 0)):
        state = model.new_state(policy)
        prefill(model, state, ids[:14])
        cp = state.checkpoint()
        prefill(model, state, ids[14:])
        assert_refused(model, state, lambda s=state, c=cp: s.rollback(c), "slack")
        assert state.plan_truncate(14) == expected_start
        truncate(model, state, 14)
        assert state.tokens == ids[:14]
        assert_exact(model, state)
    state = model.new_state(SnapshotPolicy(stride=64, sliding_slack=SLACK))
    prefill(model, state, ids[:14])
    state.mark(14)
    prefill(model, state, ids[14:])
    assert state.plan_truncate(14) == 14  # the turn-boundary mark
    truncate(model, state, 14)
    assert_exact(model, state)


def test_sliding_rewinds_within_the_ring(models: StateModels) -> None:
    """Exact without snapshots: up to `slack + 1` positions once the ring has wrapped, and
    anywhere while it has evicted nothing (a short prompt; the probe at position 1)."""
    loaded = models.get("sliding")
    model = loaded.model
    state = grown(loaded, "sliding", WINDOW + SLACK - 2)
    assert state.layers[0].max_rollback() == state.offset
    cp = state.checkpoint()
    model.forward(token_ids(1, 2), state)
    state.rollback(cp)
    assert_exact(model, state)
    truncate(model, state, 1)
    assert state.plan_truncate(0) == 0
    assert_exact(model, state)

    state = grown(loaded, "sliding", 30)
    assert state.layers[0].max_rollback() == SLACK + 1
    cp = state.checkpoint(record=True)
    model.forward(token_ids(2, 8), state, logits="all")
    assert_refused(model, state, lambda: state.rollback(cp), "slack")
    assert_refused(model, state, lambda: state.rollback_retaining(cp, 1), "slack")
    state.rollback_retaining(cp, 8 - SLACK - 1)  # trims slack + 1 rows: within the ring
    assert_exact(model, state)
    cp = state.checkpoint(record=True)
    model.forward(token_ids(3, 8), state, logits="all")
    state.commit(cp)  # a full accept rewinds nothing, however many rows
    assert_exact(model, state)


@pytest.mark.parametrize("kind", KINDS)
def test_a_forward_that_cannot_be_undone_poisons_the_state_until_reset(
    models: StateModels, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed forward is undone (tests/engine/test_state_failures.py); where the undo
    itself fails (out of memory again) nothing can be trusted: refuse until a reset."""
    model = models.get(kind).model
    state = grown(models.get(kind), kind, 12)
    cp = state.checkpoint()

    def broken_mlp(x: Any) -> Any:
        raise RuntimeError("out of memory (simulated)")

    def broken_undo(point: Any) -> bool:
        raise MemoryError("out of memory again (simulated)")

    with monkeypatch.context() as patch:
        patch.setattr(model.layers[1], "mlp", broken_mlp)  # after layer 0 and 1's mixer ran
        patch.setattr(state.layers[0], "undo_forward", broken_undo)
        with pytest.raises(RuntimeError, match="simulated"):
            model.forward(token_ids(1, 5), state)
    assert state.is_poisoned
    refused: list[Callable[[], Any]] = [
        lambda: model.forward([PROBE], state),
        lambda: state.checkpoint(),
        lambda: state.rollback(cp),
        lambda: truncate(model, state, 5),
        lambda: state.plan_truncate(5),
        lambda: state.mark(state.offset),
    ]
    for call in refused:
        with pytest.raises(StateError, match="failed forward"):
            call()
    assert state.is_poisoned
    state.reset()
    assert not state.is_poisoned and state.offset == 0 and state.snapshot_positions() == []
    prefill(model, state, token_ids(2, 20))
    assert_exact(model, state)


@pytest.mark.parametrize("kind", ["sliding", "hybrid"])
def test_snapshot_rings_keep_exactly_the_newest(models: StateModels, kind: str) -> None:
    loaded = models.get(kind)
    policy = SnapshotPolicy(stride=8, stride_capacity=3, marked_capacity=2, sliding_slack=SLACK)
    state = loaded.model.new_state(policy)
    ids = token_ids(0, 80)
    prefill(loaded.model, state, ids[:58])  # stride snapshots at 8, 16, ..., 56
    for end in (59, 61, 62):
        state.mark(state.offset)  # at 58, 59, 61
        prefill(loaded.model, state, ids[state.offset : end])
    by_store = [(store, pos) for store, pos, _ in state.snapshot_items()]
    stride = [("stride", 40), ("stride", 48), ("stride", 56)]
    assert by_store == [*stride, ("marked", 59), ("marked", 61)]
    prefill(loaded.model, state, ids[62:80])  # stride snapshots at 64, 72, 80
    assert state.snapshot_positions() == [59, 61, 64, 72, 80]
    assert state.plan_truncate(62) == 61
    assert state.plan_truncate(58) == 0  # everything before was evicted: replay from 0
    truncate(loaded.model, state, 58)
    assert_exact(loaded.model, state)


def test_full_attention_keeps_no_snapshots(models: StateModels) -> None:
    loaded = models.get("llama")
    state = grown(loaded, "llama", 600)  # > stride 256
    state.mark(state.offset)
    assert state.snapshot_positions() == [] and state.snapshot_nbytes() == 0
    assert state.nbytes() == sum(layer.nbytes() for layer in state.layers)


KV_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}  # per element of a K/V row


def expected_snapshot_bytes(loaded: LoadedModel, state: SequenceState) -> int:
    """From the config alone: what each stored snapshot must hold."""
    cfg = loaded.config
    # the stores at one position share one snapshot: it is taken once
    positions = {pos for _, pos, _ in state.snapshot_items()}
    if cfg.sliding_window:  # a copy of the ring: keys, values (in the KV dtype), positions
        ring, row_bytes = WINDOW + SLACK, KV_BYTES[dtype_name(loaded.ops.kv_dtype)]
        per_layer = 2 * cfg.num_kv_heads * ring * cfg.head_dim * row_bytes + ring * 8
        return len(positions) * cfg.num_layers * per_layer
    # recurrent layers keep references, so two stores at one position share the arrays
    conv_channels = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
    conv_channels += cfg.linear_num_value_heads * cfg.linear_value_head_dim
    conv = (cfg.linear_conv_kernel_dim - 1) * conv_channels * 4
    ssm = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    num_linear = sum(cfg.layer_type(i) == "linear_attention" for i in range(cfg.num_layers))
    return len(positions) * num_linear * (conv + ssm)


@pytest.mark.parametrize("backend", ["numpy", "numpy-float32", "mlx"])
@pytest.mark.parametrize("kind", ["sliding", "hybrid"])
def test_snapshot_nbytes_is_what_the_snapshots_hold(
    models: StateModels, kind: str, backend: str
) -> None:
    loaded = models.get(kind, backend)
    state = loaded.model.new_state(POLICIES[kind])
    state.mark(21)
    state.mark(40)  # on a stride snapshot: a second store at the same position
    prefill(loaded.model, state, token_ids(0, 50))
    items = [(store, pos) for store, pos, _ in state.snapshot_items()]
    assert ("stride", 40) in items and ("marked", 40) in items and ("marked", 21) in items
    held: dict[int, int] = {}
    for _, _, snaps in state.snapshot_items():
        for snap in snaps:
            for array in () if snap is None else snap:
                held[id(array)] = int(array.nbytes)
    assert state.snapshot_nbytes() == sum(held.values()) == expected_snapshot_bytes(loaded, state)
    live = sum(layer.nbytes() for layer in state.layers)
    assert state.nbytes() == live + state.snapshot_nbytes()


def test_models_fixture_builds_all_kinds(models: StateModels) -> None:
    """Guards the fixtures: each kind has the layer types the tests above rely on."""
    kinds = {k: set(models.get(k).config.layer_types) for k in KINDS}
    assert kinds["sliding"] == {"sliding_attention"}
    assert kinds["hybrid"] == {"linear_attention", "full_attention"}
    assert models.get("sliding").config.sliding_window == WINDOW
