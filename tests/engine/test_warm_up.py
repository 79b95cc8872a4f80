"""The warm-up at load (ModelRunner.warm_up, EngineConfig.warm_up): on an MLX GPU the
loader runs a short prompt's prefill, a verify's rows and a decode step on a state of
their own, so the kernels a first prompt needs compile while the model loads. It must
leave every later answer as it was, and it says what it is doing while it runs."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from bench.shapes import SHAPES
from bench.shapes_gguf import write_gguf
from engine import device_sampling, loader
from engine.config import EngineConfig
from engine.loader import load_model
from engine.models.qwen3_5 import CHUNKED_ABOVE
from engine.runner import ModelRunner
from engine.runner.runner import WARM_UP_ROWS, on_gpu
from kernels import few_query_attention

PROMPT = [int(t) for t in np.random.default_rng(11).integers(3, 200, 37)]
WARM_UP = ModelRunner.warm_up  # the method itself, whatever a test patches over it


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return write_gguf(SHAPES["tiny-qwen3.5"], tmp_path_factory.mktemp("warm") / "h.gguf")


def _mlx(environ: dict[str, str] | None = None) -> EngineConfig:
    return replace(EngineConfig.from_environment(environ or {}), backend="mlx")


def _logits(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32))  # bfloat16 on a GPU has no NumPy form


def _models(hybrid, tiny_llama_q4_gguf):
    return {"hybrid": hybrid, "llama": tiny_llama_q4_gguf[0]}


@pytest.mark.parametrize("family", ["hybrid", "llama"])
def test_the_warm_up_runs_each_kind_of_call_on_a_state_of_its_own(
    family, hybrid, tiny_llama_q4_gguf, monkeypatch
):
    runner = load_model(_models(hybrid, tiny_llama_q4_gguf)[family], _mlx()).runner
    before = _logits(runner.forward(PROMPT, runner.new_state(), "all"))
    calls = []
    forward = runner.forward

    def recorded(ids, state, logits="last"):
        calls.append((len(ids), id(state), max(ids) < runner.config.vocab_size))
        return forward(ids, state, logits)

    monkeypatch.setattr(runner, "forward", recorded)
    runner.warm_up()
    # a prefill chunk past the few-query rows and the recurrence's row-by-row limit,
    # a verify's rows, a step: all on one state, every id in the vocabulary
    assert max(few_query_attention.FEW_QUERY_ROWS, CHUNKED_ABOVE) < WARM_UP_ROWS
    assert [c[0] for c in calls] == [WARM_UP_ROWS, 4, 1]
    assert len({c[1] for c in calls}) == 1 and all(c[2] for c in calls)
    # and a prompt after it gets the logits it got before, bit for bit
    after = _logits(forward(PROMPT, runner.new_state(), "all"))
    np.testing.assert_array_equal(after, before)


def _load_stages(path, config, monkeypatch, gpu: bool) -> tuple[list[str], int]:
    warmed = []

    def counted(self):
        warmed.append(self)
        return WARM_UP(self)

    monkeypatch.setattr(ModelRunner, "warm_up", counted)
    monkeypatch.setattr(loader, "on_gpu", lambda ops: gpu)
    stages: list[str] = []
    load_model(path, config, progress=lambda stage, _fraction: stages.append(stage))
    return stages, len(warmed)


def test_the_loader_warms_up_on_a_gpu_and_says_so(hybrid, monkeypatch):
    rows = []
    draw = device_sampling.warm_up
    monkeypatch.setattr(device_sampling, "warm_up", lambda row: rows.append(row) or draw(row))
    stages, warmed = _load_stages(hybrid, _mlx(), monkeypatch, gpu=True)
    assert warmed == 1
    # a sampled reply's draw, from the warm-up step's logits
    assert len(rows) == 1 and rows[0].size == load_model(hybrid, _mlx()).config.vocab_size
    assert stages.index("compiling GPU kernels") < stages.index("ready") == len(stages) - 1
    assert stages.index("preparing layers") < stages.index("compiling GPU kernels")


def test_BRANCHCHAT_WARM_UP_0_loads_without_it(hybrid, monkeypatch):
    config = _mlx({"BRANCHCHAT_WARM_UP": "0"})
    assert config.warm_up is False and _mlx().warm_up is True
    stages, warmed = _load_stages(hybrid, config, monkeypatch, gpu=True)
    assert warmed == 0 and "compiling GPU kernels" not in stages


def test_off_a_gpu_nothing_is_compiled_at_load(hybrid, tiny_llama_q4_gguf, monkeypatch):
    # the NumPy backend and MLX's CPU run nothing ahead: there is nothing to compile
    for path, config in ((hybrid, EngineConfig.from_environment({})), (hybrid, _mlx())):
        gpu = on_gpu(load_model(path, replace(config, warm_up=False)).ops)
        stages, warmed = _load_stages(path, config, monkeypatch, gpu=gpu)
        assert (warmed, "compiling GPU kernels" in stages) == ((1, True) if gpu else (0, False))
    assert on_gpu(load_model(hybrid, _mlx()).ops) is (mx.default_device() == mx.gpu)


def test_the_warm_up_draw_is_a_nucleus_draw_of_the_row():
    row = mx.zeros((300,), dtype=mx.float32)
    row[5] = 30.0  # all but 1e-9 of the mass: the nucleus at top-p 0.95 is token 5 alone
    assert device_sampling.warm_up(row) == 5
    assert device_sampling.warm_up(row[None]) == 5  # a step's [1, V] logits alike
    row[9] = 30.0  # two tokens of equal weight: the uniform 0.5 falls at their boundary
    assert device_sampling.warm_up(row) in (5, 9)
