"""A full-attention layer's causal mask travels as a CausalMask (kernels/masks.py), which
each backend turns into its own form: NumPy the bool array, MLX its "causal" kernel aligned
to the last key. Both must attend exactly as the explicit array does, including a chunk
whose queries start past position 0 (the prefill chunks after the first)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.kv_state import FullKV, causal_mask
from kernels.masks import CausalMask
from kernels.ops import make_ops


def test_the_array_is_each_rows_own_position_and_those_before_it():
    mask = CausalMask(start=3, rows=4).array()
    assert mask.shape == (4, 7)
    np.testing.assert_array_equal(mask, causal_mask(3, 4, np.arange(7)))
    assert mask[0].tolist() == [True] * 4 + [False] * 3
    assert not mask.flags.writeable  # shared by every layer of a forward
    assert CausalMask(3, 4).array() is mask


@pytest.mark.parametrize("backend", ["numpy", "mlx"])
@pytest.mark.parametrize("start", [0, 5])
def test_attention_with_causal_mask_equals_the_explicit_mask(backend: str, start: int):
    ops = make_ops(backend, "float32", kv_dtype="float32")
    rng = np.random.default_rng(start)
    rows, hq, hkv, dim = 6, 4, 2, 16
    q = rng.standard_normal((hq, rows, dim), dtype=np.float32)
    k = rng.standard_normal((hkv, start + rows, dim), dtype=np.float32)
    v = rng.standard_normal((hkv, start + rows, dim), dtype=np.float32)
    args = [ops.asarray(a) for a in (q, k, v)]
    got = ops.to_numpy(ops.attention(*args, 0.25, CausalMask(start, rows)))
    want = ops.to_numpy(
        ops.attention(*args, 0.25, causal_mask(start, rows, np.arange(start + rows)))
    )
    # float32 on either device: a row attending one key too many or too few moves it by ~0.1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if start:  # a mask aligned to key 0 (row i sees keys 0..i) gives other rows
        early = np.tril(np.ones((rows, start + rows), dtype=bool))
        wrong = ops.to_numpy(ops.attention(*args, 0.25, early))
        assert np.abs(got - wrong).max() > 0.1


def test_a_full_layers_append_hands_attention_a_causal_mask():
    ops = make_ops("numpy")
    kv = FullKV(ops, num_kv_heads=1, head_dim=4)
    rows = np.zeros((1, 3, 4), np.float32)
    assert kv.append(rows, rows)[2] == CausalMask(0, 3)
    assert kv.append(rows[:, :1], rows[:, :1])[2] is None  # one row sees every key
    assert kv.append(rows, rows)[2] == CausalMask(4, 3)
