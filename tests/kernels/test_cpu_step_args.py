"""kernels._qmatmul's step_plan / step_run refuse arguments that do not fit the plan,
naming what is wrong, before anything is written (kernels/csrc/step_module.c)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.loader import load_model
from engine.runner import cpu_step
from tests.tiny_models import make_llama_gguf

pytestmark = pytest.mark.skipif(cpu_step.extension() is None, reason="the C kernel is not built")


@pytest.fixture(scope="module")
def step(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("step_args") / "m.gguf"
    make_llama_gguf(path, qtype="Q8_0")
    return load_model(path, EngineConfig(backend="numpy")).runner.cpu_step


def _arguments(step: Any, rows: int = 1, capacity: int = 256) -> list[Any]:
    cfg = step.model.config
    H, D = cfg.num_kv_heads, cfg.head_dim
    kv = tuple(
        (np.zeros((H, capacity, D), np.float32), np.zeros((H, capacity, D), np.float32))
        for _ in range(cfg.num_layers)
    )
    tables = tuple(step._rope_table(rope, 16) for rope in step.ropes)
    x = np.zeros((rows, cfg.hidden_size), np.float32)
    logits = np.zeros((1, cfg.vocab_size), np.float32)
    return [step.plan, x, 0, kv, tables, logits]


def test_good_arguments_run_and_write_the_rows(step: Any) -> None:
    args = _arguments(step, rows=2)
    args[1][:] = np.random.default_rng(0).standard_normal(args[1].shape)
    cpu_step.extension().step_run(*args)
    keys = args[3][0][0]
    assert np.abs(keys[:, :2]).max() > 0 and not keys[:, 2:].any()  # rows 0, 1 only
    assert np.isfinite(args[5]).all() and np.abs(args[5]).max() > 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.__setitem__(1, np.zeros((65, a[1].shape[1]), np.float32)), "x must be"),
        (lambda a: a.__setitem__(1, a[1].astype(np.float64)), "float32"),
        (lambda a: a.__setitem__(3, a[3][:-1]), "one KV tuple per layer"),
        (lambda a: a.__setitem__(2, 256), "capacity"),
        (lambda a: a.__setitem__(4, tuple((c[:0], s[:0]) for c, s in a[4])), "rope table"),
        (lambda a: a.__setitem__(5, np.zeros((2, a[5].shape[1]), np.float32)), "logits must"),
    ],
    ids=["rows", "dtype", "layers", "capacity", "table", "logit rows"],
)
def test_bad_arguments_are_refused(step: Any, change: Any, message: str) -> None:
    args = _arguments(step)
    change(args)
    with pytest.raises(ValueError, match=message):
        cpu_step.extension().step_run(*args)


def test_a_plan_is_checked_against_its_sizes(step: Any, tmp_path: Path) -> None:
    ext, cfg = cpu_step.extension(), step.model.config
    sizes = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 0, cfg.vocab_size)
    with pytest.raises(ValueError, match="sizes"):
        ext.step_plan(sizes, 1e-5, 0, (), step.model.norm, (), ())
    with pytest.raises(TypeError, match="StepPlan"):
        ext.step_run(object(), *_arguments(step)[1:])
