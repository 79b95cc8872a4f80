"""The real Gemma 3 270M (Q4_K_M GGUF, sliding window 512): its greedy continuation of a
plain prompt is llama.cpp's, and a rollback past the window equals a fresh prefill."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.loader import LoadedModel, load_model
from engine.model_catalog import GEMMA3_270M
from engine.sequence import prefill, truncate
from engine.state import SnapshotPolicy

pytestmark = pytest.mark.real_model

BOS = 2
# llama-cpp-python 0.3.36 on the same file, greedy after [BOS] "The capital of France is":
# " the capital of the country of France. It is the largest city"
LLAMA_CPP_GREEDY = [506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 7488, 3207]


@pytest.fixture(scope="module")
def gemma() -> LoadedModel:
    if not GEMMA3_270M.is_present():
        pytest.skip("Gemma 3 270M is not downloaded (python -m engine fetch gemma3-270m)")
    return load_model(GEMMA3_270M.path(), EngineConfig(backend="numpy"))


@pytest.fixture(scope="module")
def gemma_float() -> LoadedModel:
    # float32 matmuls (cpu_matmul="float"): with int8 activations a row is bit-identical
    # however the prompt is chunked only where attention is too; NumPy's attention for chunks
    # over 64 rows (kernels/ops_numpy.py) rounds differently from the C one, and the int8
    # quantization of the next layer turns that ~1e-6 into ~0.5 on the logits (100 tokens as
    # one chunk vs 50 + 50 on SmolLM2: 0.90; 20 + 20 vs 40, all C attention: 0.0)
    if not GEMMA3_270M.is_present():
        pytest.skip("Gemma 3 270M is not downloaded (python -m engine fetch gemma3-270m)")
    return load_model(GEMMA3_270M.path(), EngineConfig(backend="numpy", cpu_matmul="float"))


def test_greedy_continuation_is_llama_cpps(gemma: LoadedModel) -> None:
    model, ids = gemma.runner, [BOS, *gemma.tokenizer.encode("The capital of France is")]
    state, out = model.new_state(), []
    logits = model.forward(ids, state)
    for _ in LLAMA_CPP_GREEDY:
        out.append(int(model.ops.argmax_rows(logits)[-1]))
        logits = model.forward(out[-1:], state)
    assert out == LLAMA_CPP_GREEDY


def test_rollback_past_the_window_equals_a_fresh_prefill(gemma_float: LoadedModel) -> None:
    model, window = gemma_float.runner, gemma_float.config.sliding_window
    assert window == 512
    policy = SnapshotPolicy(stride=128, sliding_slack=16)
    ids = [BOS, *[int(t) for t in np.random.default_rng(0).integers(10, 200_000, 640)]]
    state = model.new_state(policy)
    prefill(model, state, ids, chunk_size=256)
    truncate(model, state, 560)  # 81 back: deeper than the ring's slack, past the window
    tail = [236761, 1030, 563, 506]
    got = model.ops.to_numpy(prefill(model, state, tail))
    want = model.ops.to_numpy(prefill(model, model.new_state(policy), ids[:560] + tail))
    assert np.abs(got - want).max() <= 1e-3  # logits of magnitude ~30, float32
    assert np.argmax(got) == np.argmax(want)
