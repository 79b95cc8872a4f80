"""The state contracts on Gemma 3's mixed stack (five sliding rings to one full KV): the
property test's random operations (tests/engine/test_state_property.py), each followed by
a comparison of the next-token logits with a fresh prefill."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from engine.loader import load_model
from engine.state import SnapshotPolicy
from tests.engine.test_state_property import StateOperations
from tests.tiny_families import make_family_hf
from tests.tolerances import engine_config

POLICY = SnapshotPolicy(stride=8, stride_capacity=4, marked_capacity=2, sliding_slack=4)


@pytest.mark.parametrize(("backend", "examples"), [("numpy", 25), ("mlx", 5)])
def test_gemma3_random_operations_match_fresh_prefill(
    tmp_path: Path, backend: str, examples: int
) -> None:
    make_family_hf(tmp_path / "g", "gemma3", tie=True, sliding_window=8)
    loaded = load_model(
        tmp_path / "g", engine_config(f"{backend}-float32" if backend == "mlx" else backend)
    )
    assert loaded.config.layer_types.count("sliding_attention") == 5
    run_state_machine_as_test(
        lambda: StateOperations(loaded, POLICY, tmp_path),
        settings=settings(
            max_examples=examples,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
