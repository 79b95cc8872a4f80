"""GGUF -> MLX directory conversion: the directory loads back to the same logits, keeps the
quantized weights as they were, and (when mlx-lm is installed) mlx-lm reads it too; what it
cannot convert (a Qwen2 file, a rope table that is no llama3 scaling's) it refuses by name.
K-quants: test_convert_kquants.py; llama.cpp's own files: test_convert_oracles.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_map

from engine.config import EngineConfig
from engine.convert import _llama3_rope, check_convertible, convert_gguf
from engine.default_model import default_model_path, is_default_model_present
from engine.errors import ModelLoadError, UnsupportedArchitecture
from engine.loader import load_model, read_gguf
from tests.oracles.fixture_files import FIXTURES
from tests.tiny_families import make_family_gguf
from tests.tiny_models import reference_forward
from tests.tolerances import BACKENDS, as_f64, assert_logits_close, compute_dtype, engine_config

PROMPT_IDS = [1, 40, 71, 72, 3, 88, 150, 200, 17, 2, 5, 99, 250, 31]
PROMPT_TEXT = (
    "<|im_start|>user\nWhat is the capital of France? Answer in one word.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def _logits(path: Path, backend: str, ids: list[int]) -> np.ndarray:
    return _logits_and_dtype(path, backend, ids)[0]


def _logits_and_dtype(path: Path, backend: str, ids: list[int]) -> tuple[np.ndarray, str]:
    lm = load_model(path, engine_config(backend))
    out = lm.runner.forward(ids, lm.runner.new_state(), logits="all")
    return as_f64(out), compute_dtype(lm.ops)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("qtype", "embed_qtype"),
    [("Q4_0", None), ("Q8_0", None), ("F32", None), ("Q4_1", "Q8_0")],
)
def test_converted_directory_has_the_gguf_logits(
    tiny_models, tmp_path: Path, backend: str, qtype: str, embed_qtype: str | None
):
    gguf_path, spec = tiny_models.gguf(qtype=qtype, embed_qtype=embed_qtype, tie=False)
    out = convert_gguf(gguf_path, tmp_path / "mlx")
    from_gguf, dtype = _logits_and_dtype(gguf_path, backend, PROMPT_IDS)
    from_dir = _logits(out, backend, PROMPT_IDS)
    reduction = spec.config["hidden_size"]
    assert_logits_close(from_dir, from_gguf, dtype, reduction, "directory against GGUF:")
    # and both are the HF-layout model the file decodes to (rows un-permuted correctly)
    want = reference_forward(spec, PROMPT_IDS)
    if dtype == "float32":
        assert np.abs(from_dir - want).max() <= 1e-3
    else:
        assert_logits_close(from_dir, want, dtype, reduction, "directory against reference:")


def test_config_and_quantized_tensors(tiny_models, tmp_path: Path):
    gguf_path, spec = tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0", tie=True)
    out = convert_gguf(gguf_path, tmp_path / "mlx")
    config = json.loads((out / "config.json").read_text())
    c = spec.config
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "head_dim",
        "rope_theta",
        "max_position_embeddings",
        "rms_norm_eps",
    ):
        assert config[key] == c[key], key
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    # 4-bit layers globally, the Q8_0 embedding through mlx-lm's per-layer override
    assert config["quantization"] == {
        "group_size": 32,
        "bits": 4,
        "model.embed_tokens": {"group_size": 32, "bits": 8},
    }
    tensors = mx.load(str(out / "model.safetensors"))
    assert "lm_head.weight" not in tensors
    D, F = c["hidden_size"], c["intermediate_size"]
    assert tensors["model.layers.0.mlp.up_proj.weight"].dtype == mx.uint32
    assert tensors["model.layers.0.mlp.up_proj.weight"].shape == (F, D * 4 // 32)
    assert tensors["model.layers.0.mlp.up_proj.scales"].shape == (F, D // 32)
    assert tensors["model.embed_tokens.weight"].shape == (c["vocab_size"], D * 8 // 32)
    assert tensors["model.norm.weight"].dtype == mx.float32


def test_float_gguf_has_no_quantization_entry(tiny_models, tmp_path: Path):
    gguf_path, _ = tiny_models.gguf(qtype="F32")
    config = json.loads((convert_gguf(gguf_path, tmp_path / "mlx") / "config.json").read_text())
    assert "quantization" not in config


def test_tokenizer_and_chat_template_survive(tiny_models, tmp_path: Path):
    gguf_path, _ = tiny_models.gguf(qtype="Q4_0")
    out = convert_gguf(gguf_path, tmp_path / "mlx")
    a, b = load_model(gguf_path).tokenizer, load_model(out).tokenizer
    text = "<|im_start|>user\nthe cat is on the mat 123<|im_end|>\n"
    assert b.encode(text) == a.encode(text)
    assert (b.bos_id, b.eos_id, b.eos_ids, b.add_bos) == (a.bos_id, a.eos_id, a.eos_ids, a.add_bos)
    assert b.chat_template == a.chat_template


def test_a_qwen2_gguf_is_refused_by_its_architecture(tmp_path: Path):
    path = FIXTURES / "qwen2" / "Q8_0.gguf"
    message = "takes Llama, Qwen3, Qwen3.5 and Gemma 3 GGUF files, not 'qwen2'"
    with pytest.raises(UnsupportedArchitecture, match=message):
        check_convertible(path)
    with pytest.raises(UnsupportedArchitecture, match=message):
        convert_gguf(path, tmp_path / "mlx")
    assert not (tmp_path / "mlx").exists()


def test_the_convert_command_prints_a_refusal_without_a_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = FIXTURES / "qwen2" / "Q8_0.gguf"
    argv = [sys.executable, "-m", "engine", "convert", str(path), str(tmp_path / "mlx")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "error:" in done.stderr and "not 'qwen2'" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "mlx").exists()


@pytest.mark.parametrize(
    ("table", "overrides", "message"),
    [
        ([1, 1, 1, 8, 8, 8, 8, 8], {}, "cannot be derived from fewer than 2"),
        ([1, 1.3, 2, 7.9, 8, 8, 8, 8], {}, "not the table of a llama3 rope scaling"),
        ([1, 2, 4, 8, 8, 8, 8, 8], {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
         "rope_freqs beside a linear rope scaling"),
    ],
)  # fmt: skip
def test_a_rope_table_with_no_llama3_form_is_refused(tmp_path: Path, table, overrides, message):
    path = tmp_path / "llama.gguf"
    extra = {"rope_freqs.weight": np.array(table, dtype=np.float32)}  # head_dim 16: 8 entries
    make_family_gguf(path, "llama", extra=extra, **overrides)
    with pytest.raises(ModelLoadError, match=message):
        convert_gguf(path, tmp_path / "mlx")


def test_the_headers_original_context_length_is_the_llama3_one_written():
    """The table fixes only L / low_freq_factor and L / high_freq_factor: a header's L is
    kept, and the two factors follow from it (the oracle's are 1 and 4 at L = 64)."""
    path = FIXTURES / "llama_rope_llama3" / "F16.gguf"
    files = read_gguf(path)
    table = np.array(files.weights.tensors["rope_freqs.weight"], dtype=np.float64)
    header = {"general.architecture": "llama", "llama.rope.scaling.original_context_length": 128}
    assert _llama3_rope(path, files.config, table, header) == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 2.0,
        "high_freq_factor": 8.0,
        "original_max_position_embeddings": 128,
    }


def _float32_scales(model: Any) -> None:
    """Cast an mlx-lm model's float16 scales, biases and norms to float32 in place."""
    model.update(
        tree_map(lambda x: x.astype(mx.float32) if x.dtype == mx.float16 else x, model.parameters())
    )


def test_mlx_lm_loads_the_tiny_conversion(tiny_models, tmp_path: Path):
    pytest.importorskip("mlx_lm")
    from mlx_lm.utils import load_model as mlx_lm_load_model

    gguf_path, _ = tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0", tie=True)
    out = convert_gguf(gguf_path, tmp_path / "mlx")
    model, _ = mlx_lm_load_model(out)
    _float32_scales(model)
    theirs = np.array(model(mx.array(PROMPT_IDS)[None])[0], dtype=np.float64)
    # ours with float32 K/V as mlx-lm keeps them (float16's rounding is ~1e-3 here)
    assert np.abs(theirs - _logits(out, "numpy-float32", PROMPT_IDS)).max() <= 1e-4


@pytest.mark.real_model
def test_mlx_lm_matches_the_default_model(tmp_path: Path):
    mlx_lm = pytest.importorskip("mlx_lm")
    if not is_default_model_present():
        pytest.skip(f"default model not present at {default_model_path()}")
    out = convert_gguf(default_model_path(), tmp_path / "smollm2")
    model, tokenizer = mlx_lm.load(str(out))
    ids = tokenizer.encode(PROMPT_TEXT, add_special_tokens=False)
    ours_tokenizer = load_model(default_model_path(), EngineConfig(backend="numpy")).tokenizer
    assert ids == ours_tokenizer.encode(PROMPT_TEXT)
    ours = _logits(default_model_path(), "numpy-float32", ids)  # K/V in float32, as theirs
    # as stored, mlx-lm computes in the scales' float16
    theirs = np.array(model(mx.array(ids)[None])[0].astype(mx.float32), dtype=np.float64)
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()
    assert np.abs(theirs - ours).max() <= 0.1
    # with float32 scales it is the same float32 computation as ours, up to rounding order
    _float32_scales(model)
    theirs = np.array(model(mx.array(ids)[None])[0], dtype=np.float64)
    assert np.abs(theirs - ours).max() <= 1e-3
