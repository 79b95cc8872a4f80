"""Fixtures the engine tests share."""

from __future__ import annotations

import pytest

from tests.conftest import TinyModels
from tests.engine.engine_runner import build_models


@pytest.fixture(scope="session")
def models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny full-attention (GGUF) and hybrid (HF) models, built once, read only."""
    return build_models(tiny_models, tmp_path_factory)
