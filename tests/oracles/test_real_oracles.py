"""The two real GGUF models on ~1,000 tokens of text.txt (prose, lists, code) against
transformers' float64 forward of the same file and llama.cpp's logits (fixtures/real/,
written by make_real.py; topk_stats.py says how KL is taken from top-k summaries).

The engine must agree with float64 at least as well as llama.cpp does (top-1 and mean
KL), and pick llama.cpp's greedy token at >= 95% (default model) / >= 92% (Gemma 3 270M)
of positions: llama.cpp's own quantized arithmetic bounds that agreement.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.default_model import default_model_path
from engine.loader import load_model
from kernels import int8_matmul
from tests.oracles import topk_stats
from tests.oracles.fixture_files import MANIFEST, on_cpu, real_reference

CHUNK = 256  # positions per forward: the whole text in four, the state carried between
GREEDY_AGREEMENT = {"smollm2": 0.95, "gemma3_270m": 0.92}


def gemma_path() -> Path | None:
    try:
        from engine.model_catalog import catalog_entry
    except ImportError:
        return None
    entry = catalog_entry("gemma3-270m")
    return entry.path() if entry is not None else None


def located(name: str) -> Path:
    path = default_model_path() if name == "smollm2" else gemma_path()
    if path is None or not path.is_file():
        pytest.skip(f"{name}: the model file is absent ({path}); `python -m engine fetch` it")
    expected = MANIFEST["real_models"][name]["sha256"]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        pytest.skip(f"{name}: {path} is not the file the fixtures were made from ({expected})")
    return path


def engine_summary(
    path: Path, backend: str, ids: list[int], ref_top: np.ndarray, cpu_matmul: str | None = None
) -> dict:
    """The engine's argmax, log-sum-exp and logits at the reference's top-k ids, per position."""
    with on_cpu(backend):
        config = EngineConfig(backend=backend, dtype="float32", fused=False, cpu_matmul=cpu_matmul)
        return topk_stats.teacher_forced(load_model(path, config).runner, ids, ref_top, CHUNK)


def llama_cpp_figures(ref: dict) -> dict:
    at_top = ref["llama_cpp_at_f64_top"]
    return topk_stats.figures(ref, ref["llama_cpp_argmax"], ref["llama_cpp_lse"], at_top)


@pytest.mark.parametrize("fixture", ["smollm2", "gemma3_270m"])
def test_fixture_is_consistent(fixture: str) -> None:
    """The committed summaries agree with themselves and with the manifest's figures."""
    ref = real_reference(fixture)
    n = MANIFEST["real_models"][fixture]["num_tokens"]
    assert ref["ids"].shape == (n,) and ref["f64_top_ids"].shape == (n, topk_stats.TOP_K)
    assert np.array_equal(ref["f64_top_ids"][:, 0], ref["f64_argmax"])
    theirs = llama_cpp_figures(ref)
    entry = MANIFEST["real_models"][fixture]
    assert theirs["top1_vs_f64"] == pytest.approx(entry["llama_cpp_top1_vs_f64"])
    assert theirs["mean_kl_vs_f64"] == pytest.approx(entry["llama_cpp_mean_kl_vs_f64_lumped"])
    assert theirs["mean_kl_vs_f64"] <= entry["llama_cpp_mean_kl_vs_f64_full"] * (1 + 1e-9)


@pytest.mark.real_model
@pytest.mark.parametrize("backend", ["numpy-int8", "numpy-float", "mlx"])
@pytest.mark.parametrize("name", ["smollm2", "gemma3_270m"])
def test_real_model_agrees_with_float64_as_well_as_llama_cpp(name: str, backend: str) -> None:
    """numpy-int8: the CPU's default kernel (int8 activations, as llama.cpp's), numpy-float
    the float32 one; both are held to llama.cpp's figures."""
    path = located(name)
    if backend == "numpy-int8" and not int8_matmul.has_simd():
        pytest.skip("no int8 SIMD path on this machine")
    ref = real_reference(name)
    ids = [int(t) for t in ref["ids"]]
    name_, _, cpu_matmul = backend.partition("-")
    summary = engine_summary(path, name_, ids, ref["f64_top_ids"], cpu_matmul or None)
    ours = topk_stats.figures(ref, **summary)
    theirs = llama_cpp_figures(ref)
    report = f"{name} {backend}: ours {ours}, llama.cpp {theirs}"
    failures = []
    if ours["top1_vs_f64"] < theirs["top1_vs_f64"]:
        failures.append("top-1 agreement with float64 below llama.cpp's")
    if ours["top1_vs_llama_cpp"] < GREEDY_AGREEMENT[name]:
        failures.append(f"agreement with llama.cpp's greedy choice below {GREEDY_AGREEMENT[name]}")
    if ours["mean_kl_vs_f64"] > theirs["mean_kl_vs_f64"]:
        failures.append("mean KL to float64 above llama.cpp's")
    assert not failures, f"{'; '.join(failures)} ({report})"
