"""The compiled one-token decode (MLX backend) gives the same logits as the plain path,
for attention and hybrid models, across KV-buffer growth, and stands aside while a
verify is being recorded."""

from __future__ import annotations

import numpy as np
import pytest

from engine.loader import load_model
from engine.models import compiled
from engine.state import RecurrentState
from tests.hybrid_models import make_hybrid_dir

STEPS = [5, 9, 33, 7, 3, 12, 40, 2]


def _decode_logits(lm, prompt, steps):
    state = lm.model.new_state()
    lm.model.forward(prompt, state)
    return [np.asarray(lm.ops.to_numpy(lm.model.forward([t], state))) for t in steps], state


@pytest.fixture(params=["llama", "hybrid"])
def mlx_model(request, tiny_models, tmp_path_factory):
    if request.param == "llama":
        path, _ = tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")
    else:
        path = tmp_path_factory.mktemp("hybrid-compiled")
        make_hybrid_dir(path, layout="hf")
    return load_model(path, backend="mlx")


def test_compiled_decode_matches_plain(mlx_model, monkeypatch):
    monkeypatch.setattr(compiled, "_CAPACITY_STEP", 16)  # grow (and retrace) mid-run
    prompt = list(range(3, 14))
    plain, _ = _decode_logits(mlx_model, prompt, STEPS)
    mlx_model.model.enable_compiled_decode()
    fast, state = _decode_logits(mlx_model, prompt, STEPS)
    for a, b in zip(plain, fast, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)
    assert state.tokens == prompt + STEPS


def test_compiled_decode_stands_aside_while_recording(mlx_model):
    mlx_model.model.enable_compiled_decode()
    state = mlx_model.model.new_state()
    mlx_model.model.forward(list(range(3, 14)), state)
    cp = state.checkpoint(record=True)
    has_recurrent = any(isinstance(layer, RecurrentState) for layer in state.layers)
    # a recurrent layer must tape the verify rows, which the compiled graph does not
    assert mlx_model.model.compiled_decode.supports(state) is (not has_recurrent)
    mlx_model.model.forward([5], state)
    state.rollback_retaining(cp, 0)
    assert state.tokens == list(range(3, 14))
