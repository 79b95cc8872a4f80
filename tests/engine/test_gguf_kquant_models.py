"""Tiny Llama GGUFs in the K-quants and Q5 types: every backend's logits equal the float64
reference forward over the weights gguf-py decodes the file to, and each weight is held
the way its backend computes it (packed for the C kernel; MLX quantized at group 32, a
dense matrix for MLX's missing group of 16)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from engine.config import EngineConfig
from engine.loader import load_model
from kernels import int8_matmul, qmatmul
from kernels.int8_matmul import Int8Matrix
from kernels.qmatmul import QMatrix
from kernels.quantized import QuantizedWeight
from tests.tiny_models import VOCAB_SIZE, make_llama_gguf, reference_forward
from tests.tolerances import as_f64

# rows of 256 (a K-quant super-block) everywhere: hidden, head_dim * heads, intermediate
KQUANT_SHAPE = {"hidden_size": 256, "intermediate_size": 256, "head_dim": 64}
# float32 accumulation over rows 4x the tiny model's: 2e-5 of the largest logit (the
# tiny model's 1e-4 on logits of ~10 is 1e-5)
RELATIVE_TOLERANCE = 2e-5
CASES = [
    {"qtype": "Q2_K"},
    {"qtype": "Q3_K"},
    {"qtype": "Q4_K"},
    {"qtype": "Q5_K"},
    {"qtype": "Q6_K"},
    {"qtype": "Q5_0"},
    {"qtype": "Q5_1"},
    {"qtype": "Q4_K", "embed_qtype": "Q6_K"},  # a Q4_K_M file's usual mix
]
# numpy-packed: the float kernel (cpu_matmul="float"), which RELATIVE_TOLERANCE bounds; the
# int8 one is held to its own definition in tests/kernels/test_int8_matmul.py
CONFIGS = {
    # float32 K/V: the float32 bound on the weights' decoding alone
    "numpy-packed": EngineConfig(
        backend="numpy", qmatmul=True, cpu_matmul="float", kv_dtype="float32"
    ),
    "numpy-dense": EngineConfig(backend="numpy", qmatmul=False, kv_dtype="float32"),
    "mlx": EngineConfig(backend="mlx", dtype="float32"),  # the float32 bound on any device
}
LABELS = {"Q2_K": "Q2_K", "Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "Q6_K": "Q6_K"}


def case_id(case: dict) -> str:
    return "-".join(f"{v}" for v in case.values())


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    out = {}
    for case in CASES:
        path = tmp_path_factory.mktemp("kquant") / f"{case_id(case)}.gguf"
        out[case_id(case)] = (path, make_llama_gguf(path, tie=False, **case, **KQUANT_SHAPE))
    return out


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_logits_match_the_reference(files: dict, case: dict, config: str) -> None:
    if config == "numpy-packed" and not qmatmul.available():
        pytest.skip("kernels._qmatmul is not built")
    path, spec = files[case_id(case)]
    loaded = load_model(path, CONFIGS[config])
    ids = [int(t) for t in np.random.default_rng(1).integers(0, VOCAB_SIZE, 24)]
    got = as_f64(loaded.runner.forward(ids, loaded.runner.new_state(), logits="all"))
    want = reference_forward(spec, ids)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= RELATIVE_TOLERANCE * np.abs(want).max()
    assert loaded.config.quantization == LABELS.get(case["qtype"], case["qtype"])


@pytest.mark.parametrize("qtype,mlx_quantized", [("Q4_K", True), ("Q5_0", True), ("Q6_K", False)])
def test_each_backend_holds_the_weight_it_computes_with(
    files: dict, qtype: str, mlx_quantized: bool
) -> None:
    path, _ = files[qtype]
    mlx_model = load_model(path, CONFIGS["mlx"]).model
    for w in (mlx_model.embed, mlx_model.lm_head):
        assert isinstance(w, QuantizedWeight) == mlx_quantized
        assert isinstance(w, QuantizedWeight) or (isinstance(w, mx.array) and w.ndim == 2)
    if qmatmul.available():
        numpy_model = load_model(path, CONFIGS["numpy-packed"]).model
        assert isinstance(numpy_model.embed, QMatrix) and isinstance(numpy_model.lm_head, QMatrix)
    if int8_matmul.available():
        int8_config = EngineConfig(backend="numpy", qmatmul=True, cpu_matmul="int8")
        int8_model = load_model(path, int8_config).model
        assert isinstance(int8_model.embed, Int8Matrix)
        assert isinstance(int8_model.lm_head, Int8Matrix)
