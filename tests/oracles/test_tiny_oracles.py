"""Every family and rope / sliding-window variant against transformers, the reference
implementation: tiny random checkpoints written by transformers and the GGUFs llama.cpp
made of them (tests/oracles/README.md), all positions of each committed id sequence.

A GGUF's reference is transformers run on that file's exact dequantized weights, so
quantization is no excuse: the engine computes in float32 from the same values and is
held to the float32 tolerance. llama.cpp's own distance (it rounds activations to 8 bits
for quantized matmuls) is reported beside ours, as context.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.loader import load_model
from tests.oracles.fixture_files import (
    FIXTURES,
    MANIFEST,
    TOLERANCE,
    case_names,
    checkpoint_dir,
    gguf_params,
    gguf_reference,
    max_abs_diff,
    on_cpu,
    reference,
)

BACKENDS = ["numpy", "mlx"]


def all_logits(path: Path, backend: str, sequences: list[list[int]]) -> list[np.ndarray]:
    cpu_matmul = "float" if backend == "numpy" else None
    with on_cpu(backend):
        # the float kernel: these oracles hold float32 arithmetic to ~3e-5 of transformers'
        # (the int8 kernel is held to llama.cpp's agreement in test_real_oracles.py)
        config = EngineConfig(
            backend=backend, dtype="float32", kv_dtype="float32", fused=False, cpu_matmul=cpu_matmul
        )
        runner = load_model(path, config).runner
        return [
            np.asarray(runner.forward(ids, runner.new_state(), logits="all"), dtype=np.float64)
            for ids in sequences
        ]


def dynamic_rope_limit(name: str) -> int | None:
    """Past max_position_embeddings, HF's dynamic NTK re-derives the frequencies of every
    earlier position from the sequence length, which a KV cache cannot follow: an engine
    may refuse there (naming it) instead of matching a one-shot forward."""
    config = json.loads((FIXTURES / name / "config.json").read_text())
    rope = config.get("rope_parameters") or {}
    return config["max_position_embeddings"] if rope.get("rope_type") == "dynamic" else None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", case_names())
def test_checkpoint_matches_transformers(name: str, backend: str, tmp_path: Path) -> None:
    path, limit = checkpoint_dir(name, tmp_path / name), dynamic_rope_limit(name)
    for ids, want in reference(name):
        if limit is not None and len(ids) > limit:
            try:
                [logits] = all_logits(path, backend, [ids])
            except ValueError as exc:
                assert "dynamic" in str(exc), f"refused without naming the rope type: {exc}"
                continue
        else:
            [logits] = all_logits(path, backend, [ids])
        diff = max_abs_diff(logits, want)
        assert diff <= TOLERANCE, f"{name}, {len(ids)} tokens: max abs diff {diff:.3g}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("name", "qtype"), gguf_params())
def test_gguf_matches_transformers_on_its_weights(name: str, qtype: str, backend: str) -> None:
    path, want, llama_cpp = gguf_reference(name, qtype)
    cases = reference(name)
    got = all_logits(path, backend, [ids for ids, _ in cases])
    ours = max(max_abs_diff(g, w) for g, w in zip(got, want, strict=True))
    theirs = max(max_abs_diff(c, w) for c, w in zip(llama_cpp, want, strict=True))
    types = MANIFEST["cases"][name]["ggufs"][qtype]["tensor_types"]
    assert ours <= TOLERANCE, (
        f"{name} {qtype} ({types}): max abs diff {ours:.3g} (llama.cpp's: {theirs:.3g})"
    )
