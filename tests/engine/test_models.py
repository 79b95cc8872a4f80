"""Every loader x format x backend reproduces the independent float64 reference forward.

The tiny files hold random weights; each TinySpec holds exactly the float32 values its
file decodes to, so quantized files are held to the same tolerance as float ones: any
error beyond float32 rounding is a loader or model bug, not quantization noise. MLX runs
in float32 (that bound) and in bfloat16, a GPU's default, held to a bound derived from
its rounding (tests/tolerances.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.loader import load_model
from tests.conftest import TinyModel, TinyModels
from tests.tiny_models import VOCAB_SIZE, TinySpec, reference_forward
from tests.tiny_tokenizer import build_hf_tokenizer
from tests.tolerances import (
    BACKENDS,
    FLOAT32_ATOL,
    as_f64,
    assert_logits_close,
    compute_dtype,
    engine_config,
)

NUM_TOKENS = 40
SPLIT_AT = 17

GGUF_CASES = [
    *(
        {"qtype": q, "tie": tie}
        for q in ("F32", "F16", "Q4_0", "Q4_1", "Q8_0")
        for tie in (True, False)
    ),
    {"qtype": "Q4_1", "embed_qtype": "Q8_0", "tie": True},  # the default model's mix
]
HF_CASES = [
    {"family": family, "bits": bits, "shards": shards}
    for family in ("llama", "qwen3")
    for bits in (None, 4, 8)
    for shards in (1, 2)
]
HF_CASES += [
    {"family": "llama", "bits": 4, "group_size": 64, "tie": True},  # mlx-lm's default group
    {"family": "qwen3", "bits": None, "tie": True},  # Qwen3-0.6B ties its embeddings
    # Real downloads store bfloat16 (scales too); the spec holds their exact float32 values.
    {"family": "llama", "bits": None, "dtype": "bfloat16"},
    {"family": "qwen3", "bits": 4, "dtype": "bfloat16"},
]


def case_id(case: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in case.items())


def token_ids(seed: int = 0, n: int = NUM_TOKENS) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB_SIZE, n)]


def forward_all(path: object, backend: str, ids: list[int]) -> tuple[np.ndarray, str]:
    """All logits as float64, and the dtype they were computed in."""
    model = load_model(path, engine_config(backend)).runner
    logits = model.forward(ids, model.new_state(), logits="all")
    return as_f64(logits), compute_dtype(model.ops)


def assert_matches_reference(got: np.ndarray, want: np.ndarray, dtype: str, spec: TinySpec) -> None:
    assert_logits_close(got, want, dtype, spec.config["hidden_size"], "(row, token)")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", GGUF_CASES, ids=case_id)
def test_gguf_matches_reference(tiny_models: TinyModels, case: dict, backend: str) -> None:
    path, spec = tiny_models.gguf(**case)
    ids = token_ids()
    got, dtype = forward_all(path, backend, ids)
    assert_matches_reference(got, reference_forward(spec, ids), dtype, spec)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", HF_CASES, ids=case_id)
def test_hf_dir_matches_reference(tiny_models: TinyModels, case: dict, backend: str) -> None:
    path, spec = tiny_models.hf(**case)
    ids = token_ids()
    got, dtype = forward_all(path, backend, ids)
    assert_matches_reference(got, reference_forward(spec, ids), dtype, spec)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fixture", ["tiny_llama_q4_gguf", "tiny_llama_hf", "tiny_qwen3_hf"])
def test_forward_in_two_pieces_equals_one_pass(
    request: pytest.FixtureRequest, fixture: str, backend: str
) -> None:
    path, spec = request.getfixturevalue(fixture)
    ids = token_ids(seed=1)
    model = load_model(path, engine_config(backend)).runner
    dtype = compute_dtype(model.ops)
    state = model.new_state()
    first = as_f64(model.forward(ids[:SPLIT_AT], state, logits="all"))
    second = as_f64(model.forward(ids[SPLIT_AT:], state, logits="all"))
    whole = as_f64(model.forward(ids, model.new_state(), logits="all"))
    split = np.concatenate([first, second])
    reduction = spec.config["hidden_size"]
    assert_logits_close(split, whole, dtype, reduction, "two pieces against one pass:")
    assert_matches_reference(split, reference_forward(spec, ids), dtype, spec)


@pytest.mark.parametrize("backend", BACKENDS)
def test_last_logits_are_the_last_row(tiny_llama_gguf: TinyModel, backend: str) -> None:
    path, spec = tiny_llama_gguf
    ids = token_ids(seed=2)
    model = load_model(path, engine_config(backend)).runner
    last = as_f64(model.forward(ids, model.new_state(), logits="last"))
    assert last.size == VOCAB_SIZE
    want = reference_forward(spec, ids)[-1:]
    assert_matches_reference(last.reshape(1, VOCAB_SIZE), want, compute_dtype(model.ops), spec)


def test_tiny_weights_make_context_matter(tiny_llama_gguf: TinyModel) -> None:
    """Guards the fixture itself: if earlier tokens barely moved the logits, a model that
    ignored its cache would still pass the reference comparisons."""
    _, spec = tiny_llama_gguf
    ids = token_ids(seed=3)
    changed = [(ids[0] + 1) % VOCAB_SIZE, *ids[1:]]
    diff = np.abs(reference_forward(spec, ids)[-1] - reference_forward(spec, changed)[-1])
    assert diff.max() > 100 * FLOAT32_ATOL


@pytest.mark.parametrize("fixture", ["tiny_llama_gguf", "tiny_llama_hf", "tiny_qwen3_hf"])
def test_config_and_tokenizer(request: pytest.FixtureRequest, fixture: str) -> None:
    path, spec = request.getfixturevalue(fixture)
    lm = load_model(path, EngineConfig(backend="numpy"))
    assert lm.config.family == spec.family
    assert lm.config.hidden_size == spec.config["hidden_size"]
    assert lm.config.num_layers == spec.config["num_hidden_layers"]
    assert lm.config.vocab_size == VOCAB_SIZE
    text = "<|im_start|>user\nThe cat sat on 2024 mats.<|im_end|>\n"
    assert lm.tokenizer.encode(text) == build_hf_tokenizer().encode(text).ids
