"""With int8 activations (the CPU default) a row is the same bits however it is computed.

Quantizing an activation row to int8 is not continuous: a one-ulp difference upstream can
move an xq by a step and a logit by ~0.5. So on the default path every row of a forward
goes through the C step (engine/runner/cpu_step.py), prefill included in pieces of its
rows, and rollback, truncate and a verify give exactly what a fresh prefill gives. These
tests hold the real default model to that, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.default_model import default_model_path, is_default_model_present
from engine.loader import LoadedModel, load_model
from engine.sequence import SequenceState, prefill, truncate
from engine.state import SnapshotPolicy

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(not is_default_model_present(), reason="the default model is not fetched"),
]

POLICY = SnapshotPolicy(stride=64)


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    lm = load_model(default_model_path(), EngineConfig(backend="numpy"))
    assert lm.ops.cpu_matmul == "int8" and lm.runner.cpu_step is not None
    assert lm.runner.cpu_step.rows_invariant
    assert "/matmul-int8/cpu-step/" in lm.compute_path  # a saved state says which numbers
    return lm


def token_ids(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(100, 40_000, n)]


def kv_rows(state: SequenceState, end: int) -> list[np.ndarray]:
    return [a[:, :end] for layer in state.layers for a in (layer.keys, layer.values)]


def test_a_prompt_is_the_same_bits_in_one_chunk_in_pieces_and_decoded(
    loaded: LoadedModel,
) -> None:
    runner, ids = loaded.runner, token_ids(200)
    whole = runner.new_state(POLICY)
    want = prefill(runner, whole, ids, chunk_size=256)
    assert runner.prefill_chunk(256) == runner.cpu_step.max_rows  # pieces of the C step
    decoded = runner.new_state(POLICY)
    prefill(runner, decoded, ids[:137], chunk_size=50)
    for t in ids[137:]:
        got = runner.forward([t], decoded)
        assert runner.last_path == "cpu_step"
    np.testing.assert_array_equal(got, want)
    for a, b in zip(kv_rows(decoded, 200), kv_rows(whole, 200), strict=True):
        np.testing.assert_array_equal(a, b)


def test_rollback_truncate_and_a_verify_equal_a_fresh_prefill_bit_for_bit(
    loaded: LoadedModel,
) -> None:
    runner, ids = loaded.runner, token_ids(180, seed=1)
    state = runner.new_state(POLICY)
    prefill(runner, state, ids[:150])
    for t in ids[150:170]:
        runner.forward([t], state)
    cp = state.checkpoint(record=True)
    runner.forward(ids[170:176], state, logits="all")  # a verify of six rows
    state.rollback_retaining(cp, 3)  # three of them accepted
    truncate(runner, state, 160)  # an edit ten tokens back, past a snapshot
    tail = token_ids(5, seed=2)
    got = prefill(runner, state, tail)
    want = prefill(runner, runner.new_state(POLICY), ids[:160] + tail, chunk_size=256)
    np.testing.assert_array_equal(got, want)


def test_one_wrong_row_is_caught(loaded: LoadedModel) -> None:
    """The comparison above is not vacuous: a single position's token changed 100 rows
    back moves the last logits."""
    runner, ids = loaded.runner, token_ids(120, seed=3)
    want = prefill(runner, runner.new_state(POLICY), ids)
    changed = list(ids)
    changed[20] += 1
    got = prefill(runner, runner.new_state(POLICY), changed)
    assert float(np.abs(got - want).max()) > 1e-3
