"""A Qwen3.5 hybrid's GGUF as an MLX directory (engine/convert_hybrid.py), on bench.shapes'
tiny hybrid: 2 key heads and 4 value heads, so the GGUF's tiled value-head order differs
from the grouped one the directory holds. The directory computes the GGUF's logits under
our loader and under mlx-lm (where installed); llama.cpp's own files against transformers'
logits: test_convert_oracles.py."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from bench.shapes import SHAPES
from bench.shapes_gguf import write_gguf
from engine.config import EngineConfig
from engine.convert import convert_gguf
from engine.loader import load_model, read_gguf

IDS = [3, 17, 99, 250, 8, 41, 7, 600, 12, 5, 77, 300]
CONFIG = EngineConfig(backend="mlx", dtype="float32", fused=False)
TOLERANCE = 1e-4  # float32; A_log = log(-A) comes back within an ulp of A


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("hybrid")
    gguf = write_gguf(SHAPES["tiny-qwen3.5"], root / "h.gguf")
    return gguf, convert_gguf(gguf, root / "mlx")


def _logits(path: Path) -> np.ndarray:
    runner = load_model(path, CONFIG).runner
    return np.array(runner.forward(IDS, runner.new_state(), logits="all"))


def test_the_directory_computes_the_ggufs_logits(converted):
    gguf, out = converted
    want = _logits(gguf)
    assert np.abs(_logits(out) - want).max() <= TOLERANCE


def test_value_heads_come_back_in_grouped_order(converted):
    """Grouped head g * 2 + r is tiled head r * 2 + g: heads 1 and 2 trade places."""
    gguf, out = converted
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["full_attention_interval"]) == ("qwen3_5", 4)
    assert config["rope_parameters"]["partial_rotary_factor"] == 0.25
    stored = read_gguf(gguf).weights.tensors
    weights = mx.load(str(out / "model.safetensors"))
    dt = np.array(stored["model.layers.0.linear_attn.dt_bias"])
    got = np.array(weights["language_model.model.layers.0.linear_attn.dt_bias"])
    np.testing.assert_array_equal(got, dt[[0, 2, 1, 3]])
    a = np.array(stored["model.layers.0.linear_attn.A"])
    a_log = np.array(weights["language_model.model.layers.0.linear_attn.A_log"])
    np.testing.assert_allclose(-np.exp(a_log), a[[0, 2, 1, 3]], rtol=1e-6)
    assert weights["language_model.model.layers.0.linear_attn.conv1d.weight"].shape[-1] == 1


def test_mlx_lm_computes_the_ggufs_logits(converted):
    pytest.importorskip("mlx_lm")
    from mlx.utils import tree_map
    from mlx_lm.utils import load_model as mlx_lm_load_model

    gguf, out = converted
    model, _ = mlx_lm_load_model(out)
    model.update(
        tree_map(
            lambda x: x.astype(mx.float32) if x.dtype in (mx.float16, mx.bfloat16) else x,
            model.parameters(),
        )
    )
    got = np.array(model(mx.array(IDS)[None])[0])
    assert np.abs(got - _logits(gguf)).max() <= TOLERANCE
