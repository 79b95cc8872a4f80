"""Shared fixtures: tiny random-weight models on disk, each built once per session."""

from __future__ import annotations

from engine.config import EngineConfig, configure_process

# as every entry point does, before anything loads NumPy (OpenBLAS reads its variables then)
configure_process(EngineConfig.from_environment())

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from tests.tiny_models import TinySpec, make_hf_dir, make_llama_gguf  # noqa: E402

TinyModel = tuple[Path, TinySpec]


class TinyModels:
    """Builds tiny models on demand and keeps them for the session, keyed by the builder's
    arguments, so parametrized tests share files. Callers must not modify the files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[tuple, TinyModel] = {}

    def _get(self, kind: str, builder: Any, suffix: str, **kwargs: Any) -> TinyModel:
        key = (kind, *sorted(kwargs.items()))
        if key not in self._built:
            path = self.root / f"{kind}-{len(self._built)}{suffix}"
            self._built[key] = (path, builder(path, **kwargs))
        return self._built[key]

    def gguf(self, **kwargs: Any) -> TinyModel:
        """A Llama GGUF; kwargs as `make_llama_gguf` (qtype, embed_qtype, tie, seed, ...)."""
        return self._get("llama", make_llama_gguf, ".gguf", **kwargs)

    def hf(self, family: str = "llama", **kwargs: Any) -> TinyModel:
        """An HF / MLX directory; kwargs as `make_hf_dir` (bits, group_size, shards, ...)."""
        return self._get(family, make_hf_dir, "", family=family, **kwargs)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="session")
def tiny_llama_gguf(tiny_models: TinyModels) -> TinyModel:
    """F32, tied embeddings: the simplest GGUF."""
    return tiny_models.gguf(qtype="F32")


@pytest.fixture(scope="session")
def tiny_llama_q4_gguf(tiny_models: TinyModels) -> TinyModel:
    """The default model's mix: Q8_0 embedding, Q4_1 everything else, tied."""
    return tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")


@pytest.fixture(scope="session")
def tiny_llama_hf(tiny_models: TinyModels) -> TinyModel:
    return tiny_models.hf("llama")


@pytest.fixture(scope="session")
def tiny_qwen3_hf(tiny_models: TinyModels) -> TinyModel:
    return tiny_models.hf("qwen3")
