"""Broken or unsupported model files are refused with a ModelLoadError a person can act
on: it names the file and, where one tensor is at fault, the tensor and its shapes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.errors import ModelLoadError, UnsupportedArchitecture
from engine.loader import load_model
from tests.conftest import TinyModel
from tests.tiny_models import VOCAB_SIZE, make_hf_dir, make_llama_gguf, reference_forward


def load_error(path: Path, expected: type[ModelLoadError] = ModelLoadError) -> str:
    """The message of the error loading `path` raises; it must name the file."""
    with pytest.raises(expected) as info:
        load_model(path, EngineConfig(backend="numpy"))
    message = str(info.value)
    assert path.name in message, f"message does not name {path.name}: {message}"
    return message


def shapes_in(message: str) -> set[tuple[int, ...]]:
    """Shapes written as (a, b), [a, b] or a x b, each in both axis orders (GGUF lists
    dimensions innermost first, NumPy outermost first)."""
    found = re.findall(r"[\[(]\s*(\d+(?:\s*,\s*\d+)+)\s*,?\s*[\])]", message)
    found += [",".join(m) for m in re.findall(r"\b(\d+)\s*[x×]\s*(\d+)\b", message)]
    shapes = {tuple(int(n) for n in s.split(",")) for s in found}
    return shapes | {shape[::-1] for shape in shapes}


def truncate_to_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# --- GGUF ---


def test_nonexistent_path(tmp_path: Path) -> None:
    load_error(tmp_path / "no-such-model.gguf")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    load_error(path)


def test_truncated_gguf(tmp_path: Path, tiny_llama_gguf: TinyModel) -> None:
    path = tmp_path / "truncated.gguf"
    shutil.copy(tiny_llama_gguf[0], path)
    truncate_to_half(path)
    load_error(path)


def test_random_bytes_named_gguf(tmp_path: Path) -> None:
    path = tmp_path / "noise.gguf"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    load_error(path)


def test_unknown_gguf_architecture(tmp_path: Path) -> None:
    path = tmp_path / "mamba.gguf"
    make_llama_gguf(path, arch="mamba-xyz")
    assert "mamba-xyz" in load_error(path, UnsupportedArchitecture)


def test_gguf_missing_tensor(tmp_path: Path) -> None:
    path = tmp_path / "missing.gguf"
    make_llama_gguf(path, omit=("blk.1.ffn_down.weight",))
    assert "blk.1.ffn_down.weight" in load_error(path)


def test_gguf_misshaped_tensor(tmp_path: Path) -> None:
    path = tmp_path / "misshaped.gguf"
    wrong = np.zeros((48, 64), dtype=np.float32)  # attn_q is [64 out, 64 in]
    make_llama_gguf(path, replace={"blk.0.attn_q.weight": wrong})
    message = load_error(path)
    assert "blk.0.attn_q.weight" in message
    shapes = shapes_in(message)
    assert (48, 64) in shapes and (64, 64) in shapes, message


def test_gguf_unsupported_quant_type_is_refused_or_exact(tmp_path: Path) -> None:
    """Q5_0 is neither required nor loaded by mx.load: decode it exactly or refuse, by name;
    never run on misread weights."""
    path = tmp_path / "q5.gguf"
    spec = make_llama_gguf(path, qtype="Q5_0")
    try:  # float32 matmuls and K/V: 1e-4 bounds float32 accumulation, not int8 activations
        config = EngineConfig(backend="numpy", cpu_matmul="float", kv_dtype="float32")
        model = load_model(path, config).runner
    except ModelLoadError as err:
        assert path.name in str(err) and "Q5_0" in str(err), str(err)
        return
    ids = [int(t) for t in np.random.default_rng(0).integers(0, VOCAB_SIZE, 20)]
    got = np.asarray(model.forward(ids, model.new_state(), logits="all"), dtype=np.float64)
    assert np.abs(got - reference_forward(spec, ids)).max() <= 1e-4


# --- Hugging Face / MLX directories ---


def edit_config(directory: Path, **changes: object) -> None:
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config.update(changes)
    config_path.write_text(json.dumps(config))


def test_hf_dir_without_config(tmp_path: Path) -> None:
    directory = tmp_path / "no-config"
    make_hf_dir(directory)
    (directory / "config.json").unlink()
    load_error(directory)


def test_hf_unknown_model_type(tmp_path: Path) -> None:
    directory = tmp_path / "mamba"
    make_hf_dir(directory)
    edit_config(directory, model_type="mamba_xyz", architectures=["MambaXyzForCausalLM"])
    assert "mamba_xyz" in load_error(directory, UnsupportedArchitecture)


def test_truncated_safetensors(tmp_path: Path) -> None:
    directory = tmp_path / "truncated"
    make_hf_dir(directory)
    truncate_to_half(directory / "model.safetensors")
    with pytest.raises(ModelLoadError) as info:
        load_model(directory, EngineConfig(backend="numpy"))
    assert "model.safetensors" in str(info.value)


def test_missing_shard(tmp_path: Path) -> None:
    directory = tmp_path / "sharded"
    make_hf_dir(directory, shards=2)
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError) as info:
        load_model(directory, EngineConfig(backend="numpy"))
    assert "model-00002-of-00002.safetensors" in str(info.value)


def test_moe_config_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "moe"
    make_hf_dir(directory, "qwen3")
    moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    edit_config(directory, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], **moe)
    message = load_error(directory)
    assert re.search(r"qwen3_moe|moe|expert", message, re.IGNORECASE), message
