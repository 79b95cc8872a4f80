"""How close the engine's numbers must be to a reference, from the dtype it computes in.

float32 (the NumPy backend, MLX on a CPU, MLX with dtype="float32") keeps the suite's bound:
a max abs difference of FLOAT32_ATOL on logits of magnitude ~10, float32 accumulation only.

bfloat16 (MLX's default on a GPU) and float16 round every stored activation and weight to
the dtype's unit roundoff u (2^-8 and 2^-11). Those errors add up as a random walk: a
reduction over K terms contributes ~sqrt(K) u relative error, and a tiny model's path from
the embedding to the logits (norm, attention, MLP per layer, the head) passes about
ROUNDINGS of them. So a low-precision result is held to a relative RMS error of
ROUNDINGS * sqrt(K) * u over the whole array (logits), or over each row (a state's rows,
one per position, where an error in one row must not hide in the average). Measured with
MLX on a CPU on the tiny models (K = hidden size 64): 7-34 u in bfloat16, 8-43 u in
float16, against a bound of 64 u; a row from another token or position is ~1.4 (~360 u in
bfloat16), which tests/engine/test_tolerances.py proves the row check catches.

The NumPy backend computes in float32 but stores K/V rows in float16 by default
(EngineConfig.kv_dtype): every attention reads rows rounded to u = 2^-11, so its results
are held to float16's bound (`compute_dtype`); 'numpy-float32' keeps float32 rows and the
float32 bound. Two float16 states of the same tokens differ where float32 noise crossed a
rounding boundary: one unit in a few elements, which moves the next logits by up to ~2e-4
after one token, as far as a wrong row does at a long context; so a float16 state is
compared row by row, where a wrong row stands out at ~1.4 against 64 u.
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import numpy as np

from engine.config import EngineConfig

FLOAT32_ATOL = 1e-4
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
ROUNDINGS = 8


# The reference tests' backends: NumPy with float16 K/V (its default) and float32 K/V, MLX in
# float32 (held to FLOAT32_ATOL everywhere) and MLX in bfloat16, a GPU's default, on
# whatever device MLX runs on
BACKENDS = ["numpy", "numpy-float32", "mlx-float32", "mlx-bfloat16"]


def engine_config(backend: str, **fields: Any) -> EngineConfig:
    """'numpy' (K/V rows in float16), 'numpy-float32' (K/V in float32: NumPy computes in
    float32 either way), 'mlx' (the device's default dtype) or 'mlx-<dtype>'.

    The numpy backend multiplies packed weights in float32 here (cpu_matmul="float"):
    FLOAT32_ATOL bounds float32 accumulation, and the int8 kernel's quantized activations
    are ~1% off by design (tests/kernels/test_int8_matmul.py holds it to its definition,
    tests/oracles/test_real_oracles.py to llama.cpp's agreement with float64)."""
    name, _, dtype = backend.partition("-")
    if name == "numpy":
        fields = {"cpu_matmul": "float", **fields}
        return EngineConfig(backend=name, kv_dtype=dtype or None, **fields)
    return EngineConfig(backend=name, dtype=dtype or None, **fields)


def compute_dtype(ops: Any) -> str:
    """The coarsest dtype an op set's results pass through: 'float32', 'bfloat16' or
    'float16' (the NumPy backend's float16 K/V rows, read by every attention)."""
    if ops.name == "numpy":
        return np.dtype(ops.kv_dtype).name
    return str(ops.dtype).rsplit(".", 1)[-1]


def host(array: Any) -> np.ndarray:
    """A copy on the host, from NumPy or MLX; bfloat16, which NumPy cannot read, widened to
    float32, which holds every bfloat16 value exactly."""
    if isinstance(array, mx.array) and array.dtype == mx.bfloat16:
        array = array.astype(mx.float32)
    return np.array(array)


def as_f64(array: Any) -> np.ndarray:
    return host(array).astype(np.float64)


def relative_bound(dtype: str, reduction: int) -> float:
    """The relative RMS error a `dtype` result may carry after reductions of `reduction`."""
    return ROUNDINGS * math.sqrt(reduction) * UNIT_ROUNDOFF[dtype]


def assert_logits_close(got: Any, want: Any, dtype: str, reduction: int, what: str = "") -> None:
    """float32: max abs diff <= FLOAT32_ATOL; coarser: relative RMS <= relative_bound."""
    got, want = as_f64(got), as_f64(want)
    assert got.shape == want.shape, f"{what} shape {got.shape} != {want.shape}"
    diff = np.abs(got - want)
    if dtype == "float32":
        worst = np.unravel_index(diff.argmax(), diff.shape)
        assert diff.max() <= FLOAT32_ATOL, f"{what} max abs diff {diff.max():.3g} at {worst}"
        return
    error = _rms(diff) / _rms(want)
    bound = relative_bound(dtype, reduction)
    assert error <= bound, f"{what} relative RMS error {error:.3g} > {bound:.3g} ({dtype})"


def assert_rows_close(
    got: Any, want: Any, dtype: str, reduction: int, axis: int, what: str = ""
) -> None:
    """Each row along `axis` (a position) within relative_bound of the same row of `want`;
    float32 as assert_logits_close."""
    got, want = as_f64(got), as_f64(want)
    assert got.shape == want.shape, f"{what} shape {got.shape} != {want.shape}"
    if dtype == "float32":
        assert_logits_close(got, want, dtype, reduction, what)
        return
    diff = np.moveaxis(got - want, axis, 0).reshape(got.shape[axis], -1)
    scale = np.moveaxis(want, axis, 0).reshape(want.shape[axis], -1)
    errors = _rms(diff, axis=1) / np.maximum(_rms(scale, axis=1), np.finfo(np.float32).tiny)
    bound = relative_bound(dtype, reduction)
    worst = int(errors.argmax())
    assert errors[worst] <= bound, (
        f"{what} row {worst}: relative RMS error {errors[worst]:.3g} > {bound:.3g} ({dtype})"
    )


def _rms(x: np.ndarray, axis: int | None = None) -> Any:
    return np.sqrt(np.mean(np.square(x), axis=axis))
