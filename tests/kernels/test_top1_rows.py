"""`top1_rows`: what a greedy block draft reads back of its logits (each row's argmax and
that token's softmax probability), the same on both backends as the float64 rows say,
in the MLX dtype a GPU computes in too."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kernels.ops_mlx import MlxOps
from kernels.ops_numpy import NumpyOps


def reference(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = logits.astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    return np.argmax(x, -1), (p / p.sum(-1, keepdims=True)).max(-1)


@pytest.mark.parametrize(
    ("ops", "dtype"),
    [(NumpyOps(), None), (MlxOps(), mx.float32), (MlxOps(), mx.bfloat16)],
    ids=["numpy", "mlx-float32", "mlx-bfloat16"],
)
def test_each_row_gives_its_argmax_and_that_tokens_probability(ops, dtype) -> None:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((6, 8192)) * 4).astype(np.float32)
    logits[2, 100] = 60.0  # a sure row: its probability rounds to 1
    logits[3] = 0.0  # a flat row: the first of the ties, at 1 / N
    if dtype is not None:  # the values the device holds, rounded to its dtype
        array = mx.array(logits).astype(dtype)
        logits = np.array(array.astype(mx.float32))
    else:
        array = logits
    top, probability = ops.top1_rows(array)
    want_top, want_p = reference(logits)
    np.testing.assert_array_equal(top, want_top)
    assert top[2] == 100 and top[3] == 0
    # MLX's exp is its own approximation (~2e-5 relative); NumPy's float32 exp is exact
    # to an ulp or two
    np.testing.assert_allclose(probability, want_p, rtol=1e-6 if dtype is None else 1e-4)
    assert probability.dtype == np.float32 and probability[3] == pytest.approx(1 / 8192)
