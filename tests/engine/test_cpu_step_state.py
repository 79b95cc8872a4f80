"""The state contracts with the C decode step on: tests/engine/test_state_property.py's
random operations, run through the runner (so every call of 1..8 rows, decode, verify,
replay and short prefill chunks, takes the C step) on full-attention, sliding-window and
quantized tiny models. A forward that fails fails in whichever path took the call: after
the C step wrote its rows, or where the per-op path's sites break it."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from engine.config import EngineConfig
from engine.loader import LoadedModel, load_model
from engine.runner import cpu_step
from tests.conftest import TinyModels
from tests.engine import test_state_property as machine
from tests.engine.state_checks import SimulatedOOM, broken

pytestmark = pytest.mark.skipif(cpu_step.extension() is None, reason="the C kernel is not built")


class FailSite:
    """A site the machine breaks (`broken(site, "fail")`); the model below fails its next
    forward there, in the per-op path's own site or after the C step's call."""

    fail: Any = None

    def __init__(self, per_op_target: Any, name: str) -> None:
        self.per_op_target, self.name = per_op_target, name


class RunnerModel:
    """The loaded runner as the machine's model: its forward picks the C step or the
    per-op path, as the engine's does."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.runner, self.model = loaded.runner, loaded.model
        assert self.runner.cpu_step is not None
        self.ops, self.config = self.model.ops, self.model.config
        self.sites = {
            site: FailSite(*machine.forward_site(self.model, site))
            for site in machine.FORWARD_SITES
        }
        self.num_cpu_steps = 0

    def new_state(self, policy: Any = None) -> Any:
        return self.runner.new_state(policy)

    def forward(self, token_ids: list[int], state: Any, logits: str = "last") -> Any:
        step = self.runner.cpu_step
        with ExitStack() as stack:
            for site in [s for s in self.sites.values() if "fail" in s.__dict__]:
                stack.enter_context(broken(site.per_op_target, site.name))
                stack.callback(setattr, step, "_run", step._run)
                step._run = self._run_then_fail
            out = self.runner.forward(token_ids, state, logits)
        self.num_cpu_steps += self.runner.last_path == "cpu_step"
        return out

    def _run_then_fail(self, *args: Any) -> None:
        cpu_step.extension().step_run(*args)
        raise SimulatedOOM("out of memory (simulated) after the C step wrote its rows")


def runner_site(model: Any, site: str) -> tuple[Any, str]:
    return model.sites[site], "fail"


CASES = [  # (model, K/V dtype, examples, steps)
    ("llama", "float16", 15, 25),  # the NumPy backend's default K/V, held row by row
    ("sliding", "float16", 20, 30),
    ("llama", "float32", 10, 25),
    ("sliding", "float32", 15, 30),
    # packed 4-bit weights on the float kernel: float32 arithmetic, held to the machine's
    # float32 bound (the int8 kernel quantizes activations, so a C step and a prefill whose
    # activations differ by float32 rounding may round an activation apart)
    ("llama-q4", "float32", 10, 25),
]


@pytest.mark.parametrize(("kind", "kv_dtype", "examples", "steps"), CASES)
def test_random_operations_with_the_c_step_match_fresh_prefill(
    tiny_models: TinyModels,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    kv_dtype: str,
    examples: int,
    steps: int,
) -> None:
    config = EngineConfig(backend="numpy", kv_dtype=kv_dtype)
    if kind == "llama-q4":
        path, policy = (
            tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")[0],
            machine.POLICIES["llama"],
        )
        config = EngineConfig(backend="numpy", cpu_matmul="float", kv_dtype=kv_dtype)
    else:
        path = machine.StateModels(tiny_models, tmp_path).path(kind)
        policy = machine.POLICIES[kind]
    loaded = load_model(path, config)
    model = RunnerModel(loaded)
    monkeypatch.setattr(machine, "forward_site", runner_site)
    as_runner = type("LoadedRunner", (), {"model": model, "config": loaded.config})()
    as_runner.fingerprint = loaded.fingerprint
    run_state_machine_as_test(
        lambda: machine.StateOperations(as_runner, policy, tmp_path),
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
    assert model.num_cpu_steps > 0, "no call took the C step"
