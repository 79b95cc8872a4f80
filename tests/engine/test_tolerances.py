"""The dtype-derived bounds of tests/tolerances.py on real states: a rollback in bfloat16 (a
GPU's default), in float32, or on the NumPy backend with float16 K/V rows (its default)
continues as a fresh prefill does, within the bound, and the bound still fails a state
that kept one wrong row (a rollback one row too short, or one row overwritten by its
neighbour's), in the dtype under test.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.loader import LoadedModel
from engine.sequence import SequenceState
from tests.conftest import TinyModels
from tests.engine.test_state_property import POLICIES, StateModels, assert_rows_match, token_ids
from tests.tiny_models import VOCAB_SIZE
from tests.tolerances import (
    as_f64,
    assert_logits_close,
    assert_rows_close,
    compute_dtype,
    relative_bound,
)

# a backend as tests/tolerances.py's engine_config names it, and the dtype it is held to
BACKENDS = {"mlx-bfloat16": "bfloat16", "mlx-float32": "float32", "numpy": "float16"}
KINDS = ["llama", "hybrid"]  # full attention rows; the hybrid's tape replay and recurrence
PREFIX, DRAFTED, ACCEPTED = 20, 6, 2
PROBE = 7


@pytest.fixture(scope="module")
def models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> StateModels:
    return StateModels(tiny_models, tmp_path_factory.mktemp("tolerance_models"))


def next_logits(loaded: LoadedModel, state: SequenceState) -> np.ndarray:
    cp = state.checkpoint()
    logits = as_f64(loaded.model.forward([PROBE], state, logits="last")).reshape(-1)
    state.rollback(cp)
    return logits


def fresh(loaded: LoadedModel, kind: str, ids: list[int]) -> SequenceState:
    state = loaded.model.new_state(POLICIES[kind])
    loaded.model.forward(ids, state, logits="none")
    return state


def assert_state_close(loaded: LoadedModel, got: SequenceState, want: SequenceState) -> None:
    """Every layer's arrays (attention rows one by one, recurrent states whole) and the next
    logits within the bound of the dtype the model computes in."""
    dtype, reduction = compute_dtype(loaded.ops), loaded.config.hidden_size
    for i, (a, b) in enumerate(zip(got.layers, want.layers, strict=True)):
        arrays_a, arrays_b = a.arrays(), b.arrays()
        assert arrays_a.keys() == arrays_b.keys()
        for key in arrays_a:
            what = f"layer {i} {key!r}:"
            if key in ("k", "v"):  # [kv_heads, positions, head_dim]
                assert_rows_close(arrays_a[key], arrays_b[key], dtype, reduction, 1, what)
            else:
                assert_logits_close(arrays_a[key], arrays_b[key], dtype, reduction, what)
    want_logits = next_logits(loaded, want)
    assert_logits_close(next_logits(loaded, got), want_logits, dtype, reduction, "next logits:")


def verified(loaded: LoadedModel, kind: str, ids: list[int], keep: int) -> SequenceState:
    """A prefix, then a verify of DRAFTED rows whose first `keep` are kept (the rest
    rolled back, replaying the hybrid's tape)."""
    state = fresh(loaded, kind, ids[:PREFIX])
    cp = state.checkpoint(record=True)
    loaded.model.forward(ids[PREFIX : PREFIX + DRAFTED], state, logits="all")
    state.rollback_retaining(cp, keep)
    return state


def draft_with_a_miss(ids: list[int]) -> list[int]:
    """`ids` with the drafted token after the ACCEPTED ones replaced: the one the model
    rejected, whose row a correct rollback drops."""
    out = list(ids)
    out[PREFIX + ACCEPTED] = (ids[PREFIX + ACCEPTED] + 1) % VOCAB_SIZE
    return out


def model_for(models: StateModels, kind: str, backend: str) -> LoadedModel:
    loaded = models.get(kind, backend)
    assert compute_dtype(loaded.ops) == BACKENDS[backend]
    return loaded


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_partly_accepted_verify_continues_as_a_fresh_prefill(
    models: StateModels, kind: str, backend: str
) -> None:
    loaded = model_for(models, kind, backend)
    ids = token_ids(0, PREFIX + DRAFTED + 1)
    drafted = draft_with_a_miss(ids)
    state = verified(loaded, kind, drafted, ACCEPTED)
    loaded.model.forward([ids[PREFIX + ACCEPTED]], state, logits="none")
    want = fresh(loaded, kind, ids[: PREFIX + ACCEPTED + 1])
    assert state.tokens == want.tokens
    assert_state_close(loaded, state, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_rollback_that_keeps_one_row_too_many_fails_the_bound(
    models: StateModels, kind: str, backend: str
) -> None:
    """The rejected draft's row kept where the accepted token's belongs: its arrays and next
    logits must fail the bound against a fresh prefill of the right tokens."""
    loaded = model_for(models, kind, backend)
    ids = token_ids(0, PREFIX + DRAFTED + 1)
    state = verified(loaded, kind, draft_with_a_miss(ids), ACCEPTED + 1)
    want = fresh(loaded, kind, ids[: PREFIX + ACCEPTED + 1])
    with pytest.raises(AssertionError, match="relative RMS error|max abs diff"):
        assert_state_close(loaded, state, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_row_from_its_neighbour_fails_the_row_bound(models: StateModels, backend: str) -> None:
    loaded = model_for(models, "llama", backend)
    dtype = BACKENDS[backend]
    state = fresh(loaded, "llama", token_ids(1, 30))
    keys = as_f64(state.layers[0].arrays()["k"])  # [kv_heads, positions, head_dim]
    reduction = loaded.config.hidden_size
    assert_rows_close(keys, keys.copy(), dtype, reduction, 1)
    wrong = keys.copy()
    wrong[:, 17] = keys[:, 18]
    with pytest.raises(AssertionError, match="17"):  # the row, named in either message
        assert_rows_close(wrong, keys, dtype, reduction, 1)


def test_the_bound_grows_with_the_dtypes_rounding() -> None:
    bounds: list[Any] = [relative_bound(d, 64) for d in ("float32", "float16", "bfloat16")]
    assert bounds == sorted(bounds)
    assert relative_bound("bfloat16", 64) == pytest.approx(64 * 2.0**-8)
    # a row from another token is ~1.4 relative: far outside even bfloat16's bound
    assert relative_bound("bfloat16", 64) < 1.4 / 4


def test_a_ring_with_one_wrong_row_fails_the_row_match(models: StateModels) -> None:
    """The property test's row check on a sliding ring (float16 rows): one slot holding its
    neighbour's row is caught, though the next logits' float16 bound might let it pass."""
    loaded = models.get("sliding")
    ids = token_ids(2, 30)
    state, reference = fresh(loaded, "sliding", ids), fresh(loaded, "sliding", ids)
    assert_rows_match(loaded.model, state, reference)
    ring = state.layers[0]
    slot, neighbour = 27 % ring.size, 28 % ring.size  # type: ignore[attr-defined]
    ring.keys[:, slot] = ring.keys[:, neighbour]  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match="layer 0 k rows"):
        assert_rows_match(loaded.model, state, reference)
