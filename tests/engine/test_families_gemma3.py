"""Gemma 3 text models (HF gemma3_text / gemma3, GGUF gemma3) against the float64 reference
in both backends: the 5:1 sliding pattern with its local rope base, the global layers' rope
scaling, sandwich norms stored zero-centred (HF) or shifted (GGUF), GeGLU, embedding and
query scales; and a rollback past the window equal to a fresh prefill."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.loader import load_model
from engine.models.base import FULL, SLIDING
from engine.sequence import prefill, truncate
from engine.state import SnapshotPolicy
from tests.engine.families_util import BACKENDS, TOLERANCE, assert_matches, token_ids
from tests.tiny_families import GEMMA_WINDOW, make_family_gguf, make_family_hf
from tests.tiny_models import write_hf_dir

PATTERN = (SLIDING,) * 5 + (FULL,)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "overrides",
    [{}, {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}],
    ids=["plain", "global-linear-8"],
)
def test_gemma3_hf_matches_reference(tmp_path, backend: str, overrides: dict) -> None:
    spec = make_family_hf(tmp_path / "g", "gemma3", tie=True, **overrides)
    cfg = load_model(tmp_path / "g", EngineConfig(backend=backend)).config
    assert tuple(cfg.layer_type(i) for i in range(cfg.num_layers)) == PATTERN
    assert_matches(tmp_path / "g", spec, backend, token_ids())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_gemma3_gguf_matches_reference(tmp_path, backend: str, qtype: str) -> None:
    path = tmp_path / "g.gguf"
    spec = make_family_gguf(path, "gemma3", qtype=qtype)
    assert_matches(path, spec, backend, token_ids())


def test_gemma3_v5_rope_parameters_and_layer_types(tmp_path) -> None:
    """transformers v5 nests rope settings by layer type and lists layer_types."""
    layer_types = ["sliding_attention", "full_attention"] * 3
    spec = make_family_hf(tmp_path / "g", "gemma3", tie=True, layer_types=layer_types)
    cfg_file = tmp_path / "g" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    for key in ("rope_theta", "rope_local_base_freq", "sliding_window_pattern"):
        cfg.pop(key)
    cfg["rope_parameters"] = {
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    }
    cfg_file.write_text(json.dumps(cfg))
    got = load_model(tmp_path / "g", EngineConfig(backend="numpy")).config
    assert [got.layer_type(i) for i in range(6)] == layer_types
    assert (got.rope_theta, got.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert_matches(tmp_path / "g", spec, "numpy", token_ids())


def test_gemma3_multimodal_config_and_names(tmp_path) -> None:
    """A gemma3 (vision-language) checkpoint: text_config, language_model.* names, and a
    vision tower that is dropped."""
    spec = make_family_hf(tmp_path / "g", "gemma3", tie=True)
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in spec.weights.items()}
    renamed["model.vision_tower.patch.weight"] = np.ones((4, 4), np.float32)
    text = dict(spec.config)
    config = {"model_type": "gemma3", "text_config": text, "vision_config": {"hidden_size": 4}}
    write_hf_dir(tmp_path / "vlm", "gemma3", config, renamed)
    assert_matches(tmp_path / "vlm", spec, "numpy", token_ids())


@pytest.mark.parametrize("backend", BACKENDS)
def test_gemma3_rollback_past_the_window_equals_a_fresh_prefill(tmp_path, backend) -> None:
    make_family_hf(tmp_path / "g", "gemma3", tie=True)
    config = EngineConfig(backend=backend, dtype="float32", kv_dtype="float32")
    model = load_model(tmp_path / "g", config).runner
    policy = SnapshotPolicy(stride=8, stride_capacity=8, sliding_slack=2)
    ids = token_ids(n=48)
    state = model.new_state(policy)
    prefill(model, state, ids, chunk_size=7)
    for n in (40, 29, 3, 17):  # each further back than the window + slack from where it was
        truncate(model, state, n, chunk_size=5)
        tail = token_ids(seed=n, n=GEMMA_WINDOW * 3)
        got = model.ops.to_numpy(prefill(model, state, tail, chunk_size=4))
        fresh = model.new_state(policy)
        want = model.ops.to_numpy(prefill(model, fresh, ids[:n] + tail))
        assert np.abs(got - want).max() <= TOLERANCE
        ids = ids[:n] + tail
    assert model.config.sliding_window == GEMMA_WINDOW


def test_gemma3_takes_no_fused_path(tmp_path) -> None:
    make_family_hf(tmp_path / "g", "gemma3", tie=True)
    model = load_model(tmp_path / "g", EngineConfig(backend="mlx")).model
    assert "extra norms around the blocks" in model.unfused_features()
