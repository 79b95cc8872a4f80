"""Reading the committed oracle fixtures (written by make_fixtures.py), and running on MLX's CPU."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx
import numpy as np

from tests.tiny_tokenizer import write_hf_tokenizer

FIXTURES = Path(__file__).parent / "fixtures"
MANIFEST: dict = json.loads((FIXTURES / "manifest.json").read_text())
TOLERANCE = 1e-4  # max abs diff, float32 logits of a few units: float32 accumulation only


def case_names(with_gguf: bool = False) -> list[str]:
    return [n for n, c in MANIFEST["cases"].items() if c["ggufs"] or not with_gguf]


def gguf_params() -> list[tuple[str, str]]:
    return [(n, q) for n, c in MANIFEST["cases"].items() for q in c["ggufs"]]


def checkpoint_dir(name: str, into: Path) -> Path:
    """The case as a Hugging Face directory: its config, its weights (shared with the case
    that owns them), the tiny tokenizer."""
    owner = MANIFEST["cases"][name]["weights_from"]
    into.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FIXTURES / name / "config.json", into / "config.json")
    shutil.copyfile(FIXTURES / owner / "model.safetensors", into / "model.safetensors")
    write_hf_tokenizer(into)
    return into


def reference(name: str) -> list[tuple[list[int], np.ndarray]]:
    """(token ids, transformers' float32 logits at every position) per sequence."""
    data = np.load(FIXTURES / name / "reference.npz")
    n = MANIFEST["cases"][name]["num_sequences"]
    return [([int(t) for t in data[f"ids_{i}"]], data[f"logits_{i}"]) for i in range(n)]


def gguf_reference(name: str, qtype: str) -> tuple[Path, list[np.ndarray], list[np.ndarray]]:
    """The GGUF, transformers' logits of its dequantized weights and llama.cpp's, per sequence."""
    data = np.load(FIXTURES / name / f"{qtype}.npz")
    n = MANIFEST["cases"][name]["num_sequences"]
    hf = [data[f"hf_{i}"] for i in range(n)]
    return FIXTURES / name / f"{qtype}.gguf", hf, [data[f"llama_cpp_{i}"] for i in range(n)]


def max_abs_diff(got: np.ndarray, want: np.ndarray) -> float:
    if got.shape != want.shape:
        raise AssertionError(f"logits shape {got.shape}, reference {want.shape}")
    return float(np.abs(np.asarray(got, np.float64) - want).max())


def real_reference(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(FIXTURES / "real" / f"{name}.npz"))


@contextmanager
def on_cpu(backend: str) -> Iterator[None]:
    """MLX runs on its CPU device here, so float32 is float32 whatever the host has."""
    if backend != "mlx":
        yield
        return
    with mx.stream(mx.cpu):
        yield
