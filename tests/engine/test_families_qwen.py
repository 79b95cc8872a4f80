"""Qwen2 / Qwen2.5 (q/k/v biases) and the Qwen / Mistral sliding-window switches, as
transformers reads them, against the float64 reference in both backends."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.loader import load_model
from engine.models.base import FULL, SLIDING
from tests.engine.families_util import BACKENDS, assert_matches, forward_all, token_ids
from tests.tiny_families import make_family_gguf, make_family_hf
from tests.tiny_models import write_hf_dir


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tie", [False, True])
def test_qwen2_hf_matches_reference(tmp_path, backend: str, tie: bool) -> None:
    spec = make_family_hf(tmp_path / "q2", "qwen2", tie=tie)
    assert_matches(tmp_path / "q2", spec, backend, token_ids())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_qwen2_gguf_matches_reference(tmp_path, backend: str, qtype: str) -> None:
    path = tmp_path / "q2.gguf"
    spec = make_family_gguf(path, "qwen2", qtype=qtype)
    assert_matches(path, spec, backend, token_ids())


def test_qwen2_biases_change_the_logits(tmp_path) -> None:
    spec = make_family_hf(tmp_path / "q2", "qwen2")
    zeroed = {k: (np.zeros_like(v) if k.endswith(".bias") else v) for k, v in spec.weights.items()}
    write_hf_dir(tmp_path / "nobias", "qwen2", dict(spec.config), zeroed)
    ids = token_ids()
    diff = forward_all(tmp_path / "q2", "numpy", ids) - forward_all(
        tmp_path / "nobias", "numpy", ids
    )
    assert np.abs(diff).max() > 1e-2


def test_qwen2_refuses_the_fused_path(tmp_path) -> None:
    make_family_hf(tmp_path / "q2", "qwen2")
    model = load_model(tmp_path / "q2", EngineConfig(backend="mlx")).model
    assert "attention biases" in model.unfused_features()


def layer_types(path) -> tuple[str, ...]:
    cfg = load_model(path, EngineConfig(backend="numpy")).config
    return tuple(cfg.layer_type(i) for i in range(cfg.num_layers))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_sliding_window_without_use_sliding_window_is_full_attention(tmp_path, family) -> None:
    spec = make_family_hf(tmp_path / "m", family, sliding_window=4, use_sliding_window=False)
    assert layer_types(tmp_path / "m") == (FULL, FULL)
    assert_matches(tmp_path / "m", spec, "numpy", token_ids())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_max_window_layers_slides_the_layers_from_it_on(tmp_path, family, backend) -> None:
    spec = make_family_hf(
        tmp_path / "m", family, sliding_window=5, use_sliding_window=True, max_window_layers=1
    )
    assert layer_types(tmp_path / "m") == (FULL, SLIDING)
    assert_matches(tmp_path / "m", spec, backend, token_ids())


def test_mistral_slides_every_layer_and_llama_ignores_the_key(tmp_path) -> None:
    spec = make_family_hf(tmp_path / "mistral", "mistral", sliding_window=5)
    assert layer_types(tmp_path / "mistral") == (SLIDING, SLIDING)
    assert_matches(tmp_path / "mistral", spec, "numpy", token_ids())
    make_family_hf(tmp_path / "llama", "llama", sliding_window=5)
    # tiny_config turns a windowed llama into mistral; a real llama config.json keeps it
    cfg_file = tmp_path / "llama" / "config.json"
    cfg = json.loads(cfg_file.read_text()) | {"model_type": "llama"}
    cfg_file.write_text(json.dumps(cfg))
    assert layer_types(tmp_path / "llama") == (FULL, FULL)  # LlamaConfig has no window
