"""The MLX backend's products of a prefill chunk's many rows on a GPU (`MlxOps.wide_matmul`):
which rows take which product, and what each computes. The routing's GPU condition is
set by hand (`ops._gpu`), so the arithmetic is checked on any MLX device."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kernels.ops_mlx import WIDE_ROWS, MlxOps
from kernels.quantized import QuantizedWeight

OUT, IN = 96, 256


def quantized_weight(dtype: mx.Dtype) -> QuantizedWeight:
    w = mx.random.normal((OUT, IN), key=mx.random.key(0)) * 0.05
    packed, scales, biases = mx.quantize(w, group_size=32, bits=4)
    return QuantizedWeight(packed, scales.astype(dtype), biases.astype(dtype), 32, 4)


def rows(m: int) -> mx.array:
    return mx.random.normal((m, IN), key=mx.random.key(m)).astype(mx.float32)


def exact_product(x: mx.array, w: QuantizedWeight) -> np.ndarray:
    """x @ W^T in float64 over the weights as quantized (s * q + b)."""
    dense = mx.dequantize(
        w.packed, w.scales.astype(mx.float32), w.biases.astype(mx.float32), group_size=32, bits=4
    )
    return np.array(x, np.float64) @ np.array(dense, np.float64).T


def qmm(x: mx.array, w: QuantizedWeight) -> np.ndarray:
    out = mx.quantized_matmul(
        x, w.packed, w.scales, w.biases, transpose=True, group_size=32, bits=4
    )
    return np.array(out.astype(mx.float32))


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_rows_below_the_threshold_keep_the_quantized_product() -> None:
    ops = MlxOps("float32", wide_matmul="dense32")
    ops._gpu = True
    w = quantized_weight(mx.float32)
    x = rows(WIDE_ROWS - 1)
    np.testing.assert_array_equal(np.array(ops.linear(x, w)), qmm(x, w))


def test_off_a_gpu_every_row_count_keeps_the_quantized_product() -> None:
    ops = MlxOps("float32", wide_matmul="dense16")
    ops._gpu = False
    w = quantized_weight(mx.float32)
    x = rows(WIDE_ROWS)
    np.testing.assert_array_equal(np.array(ops.linear(x, w)), qmm(x, w))


def test_dense32_is_a_float32_product_of_the_quantized_weights() -> None:
    ops = MlxOps("float32", wide_matmul="dense32")
    ops._gpu = True
    w = quantized_weight(mx.bfloat16)  # as a GPU holds the factors
    x = rows(WIDE_ROWS)
    got = np.array(ops.linear(x, w))
    assert got.dtype == np.float32 and got.shape == (WIDE_ROWS, OUT)
    assert relative_error(got, exact_product(x, w)) < 1e-5
    # one row's product replaced by another's is caught far above that bound
    shifted = got.copy()
    shifted[3] = got[4]
    assert relative_error(shifted, exact_product(x, w)) > 0.1


def test_dense16_rounds_the_rows_to_the_compute_dtype() -> None:
    ops = MlxOps("bfloat16", wide_matmul="dense16")
    ops._gpu = True
    w = quantized_weight(mx.bfloat16)
    x = rows(WIDE_ROWS)
    got = np.array(ops.linear(x, w).astype(mx.float32))
    error = relative_error(got, exact_product(x, w))
    assert 1e-5 < error < 2**-6  # bfloat16's rounding of rows, weights and outputs


def test_quantized16_rounds_only_the_rows_and_returns_float32() -> None:
    ops = MlxOps("bfloat16", wide_matmul="quantized16")
    ops._gpu = True
    w = quantized_weight(mx.bfloat16)
    x = rows(WIDE_ROWS)
    got = np.array(ops.linear(x, w))
    assert got.dtype == np.float32 and got.shape == (WIDE_ROWS, OUT)
    # exactly MLX's product of the weights as quantized and the rows rounded to bfloat16
    # (how close that is depends on the device's kernel: the agreement bench measures it)
    np.testing.assert_array_equal(got, qmm(x.astype(mx.bfloat16), w))
    assert relative_error(got, exact_product(x, w)) > 1e-5  # the rows were rounded
    below = ops.linear(rows(WIDE_ROWS - 1), w)  # fewer rows: the float32 product
    assert below.dtype == mx.float32
    np.testing.assert_array_equal(np.array(below), qmm(rows(WIDE_ROWS - 1), w))


def test_an_unknown_product_is_refused() -> None:
    with pytest.raises(ValueError, match="wide_matmul must be one of"):
        MlxOps("float32", wide_matmul="int4")
