"""The converter on GGUFs llama.cpp itself wrote (tests/oracles: convert_hf_to_gguf.py and
llama-quantize run on tiny transformers checkpoints): the directory's rope_scaling is the
checkpoint's own (a Llama 3 file's rope_freqs table turned back into its llama3 parameters),
and the directory computes transformers' logits on the file's weights, under our loader and
under mlx-lm (where installed) alike. Q4_K_M and Q6_K hold Q6_K tensors (groups of 16)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_map

from engine.config import EngineConfig
from engine.convert import convert_gguf
from engine.loader import load_model
from tests.oracles.fixture_files import (
    FIXTURES,
    TOLERANCE,
    gguf_params,
    gguf_reference,
    max_abs_diff,
    on_cpu,
    reference,
)

# every family the converter takes: Llama (each rope scaling), Qwen3, Qwen3.5, Gemma 3
CASES = [
    (name, qtype)
    for name, qtype in gguf_params()
    if name.startswith("llama") or name in ("qwen3", "qwen3_5", "gemma3_gguf")
]
LLAMA_CASES = [case for case in CASES if case[0].startswith("llama")]


def case_id(case: tuple[str, str]) -> str:
    return "-".join(case)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("converted_oracles")
    return {case: convert_gguf(gguf_reference(*case)[0], root / case_id(case)) for case in CASES}


def test_the_cases_hold_every_rope_scaling_and_a_group_of_16():
    names = {name for name, _ in CASES}
    assert {"llama_rope_llama3", "llama_rope_linear", "llama_rope_yarn"} <= names
    assert {("llama", "Q4_K_M"), ("llama", "Q6_K")} <= set(CASES)
    assert {("qwen3", "Q4_K_M"), ("gemma3_gguf", "Q4_K_M"), ("gemma3_gguf", "Q6_K")} <= set(CASES)
    assert {("qwen3_5", "Q4_K_M"), ("qwen3_5", "Q8_0")} <= set(CASES)


@pytest.mark.parametrize("case", [c for c in CASES if not c[0].startswith("llama")], ids=case_id)
def test_a_directory_says_its_family(converted: dict, case: tuple[str, str]):
    """The keys transformers and mlx-lm read for the family, the checkpoint's own values
    (the hybrid's model_type is mlx-lm's module, qwen3_5, where the checkpoint names its
    text model, qwen3_5_text: transformers and our loader read both)."""
    config = json.loads((converted[case] / "config.json").read_text())
    checkpoint = json.loads((FIXTURES / case[0] / "config.json").read_text())
    written = {"qwen3_5_text": "qwen3_5"}.get(checkpoint["model_type"], checkpoint["model_type"])
    assert config["model_type"] == written
    for key in ("hidden_size", "num_hidden_layers", "num_key_value_heads", "head_dim"):
        assert config[key] == checkpoint[key], key
    if case[0] == "gemma3_gguf":  # a sliding window every layer but each sixth
        assert config["sliding_window"] == checkpoint["sliding_window"]
        assert config["sliding_window_pattern"] == 6
        assert config["query_pre_attn_scalar"] == checkpoint["query_pre_attn_scalar"]
        local = checkpoint["rope_parameters"]["sliding_attention"]["rope_theta"]
        assert config["rope_local_base_freq"] == local
        weights = mx.load(str(converted[case] / "model.safetensors"))
        gguf_norm = np.array(load_model_weights(case)["model.norm.weight"])
        np.testing.assert_array_equal(np.array(weights["model.norm.weight"]), gguf_norm - 1.0)


def load_model_weights(case: tuple[str, str]) -> dict[str, Any]:
    from engine.loader import read_gguf

    return dict(read_gguf(gguf_reference(*case)[0]).weights.tensors)


@pytest.mark.parametrize("case", LLAMA_CASES, ids=case_id)
def test_rope_scaling_is_the_checkpoints(converted: dict, case: tuple[str, str]):
    name, _ = case
    config = json.loads((converted[case] / "config.json").read_text())
    checkpoint = json.loads((FIXTURES / name / "config.json").read_text())
    params = {k: v for k, v in checkpoint["rope_parameters"].items() if k != "rope_theta"}
    assert config["rope_scaling"] == (None if params["rope_type"] == "default" else params)
    assert config["rope_theta"] == checkpoint["rope_parameters"]["rope_theta"]
    assert "rope_freqs.weight" not in mx.load(str(converted[case] / "model.safetensors"))


@pytest.mark.parametrize("backend", ["numpy", "mlx"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_directory_computes_transformers_logits(converted: dict, case: tuple[str, str], backend):
    _, want, _ = gguf_reference(*case)
    sequences = [ids for ids, _ in reference(case[0])]
    config = EngineConfig(backend=backend, dtype="float32", kv_dtype="float32", fused=False)
    if backend == "numpy":
        config = EngineConfig(backend="numpy", kv_dtype="float32", cpu_matmul="float")
    with on_cpu(backend):
        runner = load_model(converted[case], config).runner
        got = [runner.forward(ids, runner.new_state(), logits="all") for ids in sequences]
    diff = max(max_abs_diff(np.asarray(g), w) for g, w in zip(got, want, strict=True))
    assert diff <= TOLERANCE, f"{case}: max abs diff {diff:.3g}"


def _float32(model: Any) -> None:
    model.update(
        tree_map(
            lambda x: x.astype(mx.float32) if x.dtype in (mx.float16, mx.bfloat16) else x,
            model.parameters(),
        )
    )


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_mlx_lm_computes_transformers_logits(converted: dict, case: tuple[str, str]):
    pytest.importorskip("mlx_lm")
    from mlx_lm.utils import load_model as mlx_lm_load_model

    _, want, _ = gguf_reference(*case)
    with on_cpu("mlx"):
        model, _ = mlx_lm_load_model(converted[case])
        _float32(model)  # the float16 scales and norms, as ours: float32 arithmetic
        got = [np.array(model(mx.array(ids)[None])[0]) for ids, _ in reference(case[0])]
    diff = max(max_abs_diff(g, w) for g, w in zip(got, want, strict=True))
    assert diff <= TOLERANCE, f"{case}: mlx-lm's max abs diff {diff:.3g}"
