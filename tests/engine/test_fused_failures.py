"""A fused decode step (engine/runner/fused.py) that raises half-way is undone where the
cursor undoes it (the eager five-kernel step writes new arrays; the one-launch kernel
writes past the cursor), and poisons the state where a traced step donated the buffers.
On a CPU the kernels are the MLX-ops reference, as in test_fused_decode.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.errors import StateError
from engine.loader import load_model
from tests.conftest import TinyModels
from tests.engine.state_checks import SimulatedOOM, assert_unchanged, capture, host

PROMPT = list(range(3, 40))


@pytest.fixture
def runner(tiny_models: TinyModels) -> Any:
    # float32 on a GPU too: the checks compare against a fresh prefill at 2e-4
    lm = load_model(tiny_models.hf("llama")[0], EngineConfig(backend="mlx", dtype="float32"))
    lm.runner.fused = None
    return lm.runner


def second_layer_fails(runner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    real = runner.fused.k.residual
    calls = 0

    def residual(*args: Any) -> Any:  # two per layer: the second layer's attention output
        nonlocal calls
        calls += 1
        if calls == 3:
            raise SimulatedOOM("out of memory (simulated)")
        return real(*args)

    monkeypatch.setattr(runner.fused.k, "residual", residual)


def test_a_failed_eager_step_is_undone(runner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    runner.enable_fused_decode(compiled=False, mode="layers")
    state = runner.new_state()
    runner.forward(PROMPT, state)
    cp = state.checkpoint()
    before = capture(state)
    with monkeypatch.context() as patch:
        second_layer_fails(runner, patch)
        with pytest.raises(SimulatedOOM):
            runner.forward([5, 9], state, logits="all")
    assert not state.is_poisoned
    assert_unchanged(before, state)
    got = host(runner.forward([5, 9], state, logits="all"))
    # the same two rows on a state that never failed, through the same step: the GPU's
    # fused kernels round differently from a prefill, so only the same path compares
    fresh = runner.new_state()
    runner.forward(PROMPT, fresh)
    want = host(runner.forward([5, 9], fresh, logits="all"))
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)
    state.rollback(cp)  # armed before the failure, still exact
    assert state.tokens == PROMPT


def test_a_failed_traced_step_poisons(runner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    runner.enable_fused_decode(compiled=True, mode="layers")
    state = runner.new_state()
    runner.forward(PROMPT, state)
    with monkeypatch.context() as patch:
        second_layer_fails(runner, patch)
        with pytest.raises(SimulatedOOM):
            runner.forward([5], state)
    assert state.is_poisoned
    with pytest.raises(StateError, match="failed forward"):
        runner.forward([5], state)
