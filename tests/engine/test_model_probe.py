"""The cheap look at a model file the engine takes before it releases the model it
holds: every file the loader reads passes it, and a file cut short or not a model at all
is refused by it, naming the file, from its headers alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.default_model import default_model_path, is_default_model_present
from engine.errors import ModelLoadError
from engine.loader import load_model
from engine.model_probe import probe_model
from tests.conftest import TinyModels
from tests.hybrid_models import make_hybrid_dir
from tests.tiny_models import make_hf_dir


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q4_0", "Q4_1", "Q8_0"])
def test_every_gguf_the_loader_reads_passes(qtype: str, tiny_models: TinyModels) -> None:
    path = tiny_models.gguf(qtype=qtype)[0]
    load_model(path, EngineConfig(backend="numpy"))
    probe_model(path)


@pytest.mark.parametrize("shards", [1, 2])
def test_model_directories_pass(tmp_path: Path, shards: int) -> None:
    make_hf_dir(tmp_path / "llama", shards=shards)
    probe_model(tmp_path / "llama")
    make_hybrid_dir(tmp_path / "hybrid", "hf")
    probe_model(tmp_path / "hybrid")


def refused(path: Path, named: str) -> str:
    with pytest.raises(ModelLoadError) as info:
        probe_model(path)
    assert named in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("keep", [0.999, 0.5, 0.01])
def test_a_gguf_cut_short_is_refused(tmp_path: Path, tiny_models: TinyModels, keep: float) -> None:
    data = tiny_models.gguf(qtype="Q4_1")[0].read_bytes()
    path = tmp_path / "partial.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    assert "truncated" in refused(path, "partial.gguf")


def test_not_a_model_is_refused(tmp_path: Path) -> None:
    refused(tmp_path / "missing.gguf", "missing.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    refused(tmp_path / "empty.gguf", "empty.gguf")
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    (tmp_path / "noise.gguf").write_bytes(noise)
    refused(tmp_path / "noise.gguf", "noise.gguf")
    (tmp_path / "fake.gguf").write_bytes(b"GGUF" + noise)
    refused(tmp_path / "fake.gguf", "fake.gguf")
    (tmp_path / "folder").mkdir()
    refused(tmp_path / "folder", "folder")


def test_a_directory_with_broken_weights_is_refused(tmp_path: Path) -> None:
    make_hf_dir(tmp_path / "cut")
    weights = tmp_path / "cut" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    refused(tmp_path / "cut", "model.safetensors")
    make_hf_dir(tmp_path / "sharded", shards=2)
    (tmp_path / "sharded" / "model-00002-of-00002.safetensors").unlink()
    refused(tmp_path / "sharded", "model-00002-of-00002.safetensors")
    shutil.copytree(tmp_path / "sharded", tmp_path / "bad-config")
    (tmp_path / "bad-config" / "config.json").write_text("{not json")
    refused(tmp_path / "bad-config", "config.json")


@pytest.mark.real_model
@pytest.mark.skipif(not is_default_model_present(), reason="the default model is not fetched")
def test_the_default_model_passes() -> None:
    probe_model(default_model_path())
