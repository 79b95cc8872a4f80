"""Fixtures the engine tests share."""

from __future__ import annotations

import pytest

from tests.conftest import TinyModels
from tests.engine.engine_runner import build_models


@pytest.fixture(scope="session")
def models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny full-attention (GGUF) and hybrid (HF) models, built once, read only."""
    return build_models(tiny_models, tmp_path_factory)


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory):
    """Tiny Llama 3 and Qwen3 shapes as llama-quantize writes Q4_K_M (Q4_K, Q6_K where
    `use_more_bits` says, a Q6_K head: groups of 16, kept quantized in the table), Llama 3's
    scaled rotation table and Qwen3's q/k norms; by name, written when first asked for."""
    from bench.shapes import SHAPES
    from bench.shapes_gguf import write_gguf

    out, paths = tmp_path_factory.mktemp("q4km"), {}

    def path(name):
        if name not in paths:
            paths[name] = write_gguf(SHAPES[name], out / f"{name}.gguf")
        return paths[name]

    return path
