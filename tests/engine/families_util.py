"""What the family tests share: load a tiny file, forward every row, compare with the
float64 reference of tests/tiny_reference.py."""

from __future__ import annotations

import numpy as np

from engine.config import EngineConfig
from engine.loader import load_model
from tests.tiny_models import VOCAB_SIZE, TinySpec, reference_forward

BACKENDS = ["numpy", "mlx"]
TOLERANCE = 1e-4  # max abs diff on float32 logits of magnitude ~10: float32 accumulation only


def token_ids(seed: int = 0, n: int = 40) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB_SIZE, n)]


def forward_all(path: object, backend: str, ids: list[int]) -> np.ndarray:
    # float32 matmuls on the CPU too: TOLERANCE bounds float32 accumulation, which the int8
    # kernel's quantized activations exceed by design (tests/kernels/test_int8_matmul.py)
    cpu_matmul = "float" if backend == "numpy" else None
    config = EngineConfig(
        backend=backend, dtype="float32", kv_dtype="float32", cpu_matmul=cpu_matmul
    )  # the bound's
    model = load_model(path, config).runner
    return np.asarray(model.forward(ids, model.new_state(), logits="all"), dtype=np.float64)


def assert_matches(path: object, spec: TinySpec, backend: str, ids: list[int]) -> None:
    got, want = forward_all(path, backend, ids), reference_forward(spec, ids)
    diff = float(np.abs(got - want).max())
    assert diff <= TOLERANCE, f"max abs diff {diff:.2e} from the reference"
    assert np.array_equal(got.argmax(-1), want.argmax(-1))
