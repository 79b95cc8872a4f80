"""MlxOps.argmax_rows with an argmax its producer evaluated beside the logits
(`remember_argmax`, the fused step's): read for those very logits, and for no other array,
however equal its values."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kernels.ops_mlx import MlxOps


def test_the_remembered_argmax_serves_only_its_own_logits():
    ops = MlxOps()
    rng = np.random.default_rng(0)
    logits = mx.array(rng.standard_normal((3, 50)).astype(np.float32))
    expected = np.argmax(np.array(logits), axis=-1)
    np.testing.assert_array_equal(ops.argmax_rows(logits), expected)  # nothing remembered
    stand_in = mx.array([7, 7, 7])  # not the argmax: shows which one a read takes
    ops.remember_argmax(logits, stand_in)
    np.testing.assert_array_equal(ops.argmax_rows(logits), [7, 7, 7])
    same_values = logits + 0.0  # another array: computed afresh
    np.testing.assert_array_equal(ops.argmax_rows(same_values), expected)
    ops.remember_argmax(logits, mx.argmax(logits, axis=-1))
    np.testing.assert_array_equal(ops.argmax_rows(logits), expected)
