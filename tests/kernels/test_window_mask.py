"""A sliding layer's mask travels as a WindowMask (kernels/masks.py): the ring's slot
positions and the call's rows, compared by value, so a forward's sliding layers share one
mask, built once (NumPy's array, MLX's on the device). Both must attend exactly as the
explicit array (engine.kv_state.causal_mask with the window) does, empty slots, wrapped
slots and a window edge inside the chunk included."""

from __future__ import annotations

import numpy as np
import pytest

from engine.kv_state import causal_mask
from engine.sliding_kv import SlidingKV
from kernels.masks import WindowMask
from kernels.ops import make_ops

WINDOW = 5


def _positions(start: int, rows: int, size: int) -> np.ndarray:
    """A ring of `size` slots holding the last positions before `start` (slot p % size;
    -1 where empty), then the call's rows."""
    ring = np.full(size, -1, dtype=np.int64)
    for p in range(max(0, start - size), start):
        ring[p % size] = p
    return np.concatenate([ring, np.arange(start, start + rows)])


@pytest.mark.parametrize("start,rows", [(0, 4), (3, 6), (11, 1), (20, 9)])
def test_the_array_is_the_window_over_the_rings_positions(start, rows):
    positions = _positions(start, rows, WINDOW + 2)
    mask = WindowMask.of(start, rows, positions, WINDOW)
    want = causal_mask(start, rows, positions, WINDOW)
    np.testing.assert_array_equal(mask.array(), want)
    assert not mask.array().flags.writeable
    # another layer's equal mask: equal, and the same array
    again = WindowMask.of(start, rows, positions.copy(), WINDOW)
    assert again == mask and again.array() is mask.array()
    assert WindowMask.of(start, rows, positions, WINDOW + 1) != mask


@pytest.mark.parametrize("backend", ["numpy", "mlx"])
@pytest.mark.parametrize("start,rows", [(0, 6), (9, 6), (14, 1)])
def test_attention_with_a_window_mask_equals_the_explicit_mask(backend, start, rows):
    ops = make_ops(backend, "float32", kv_dtype="float32")
    rng = np.random.default_rng(start)
    positions = _positions(start, rows, WINDOW + 2)
    hq, hkv, dim, keys = 4, 2, 16, len(positions)
    q = rng.standard_normal((hq, rows, dim), dtype=np.float32)
    k = rng.standard_normal((hkv, keys, dim), dtype=np.float32)
    v = rng.standard_normal((hkv, keys, dim), dtype=np.float32)
    args = [ops.asarray(a) for a in (q, k, v)]
    got = ops.to_numpy(ops.attention(*args, 0.25, WindowMask.of(start, rows, positions, WINDOW)))
    explicit = causal_mask(start, rows, positions, WINDOW)
    want = ops.to_numpy(ops.attention(*args, 0.25, explicit))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # a window one wider lets each row see one more key: other rows (the test can fail)
    wider = causal_mask(start, rows, positions, WINDOW + 1)
    if start >= WINDOW:
        assert np.abs(got - ops.to_numpy(ops.attention(*args, 0.25, wider))).max() > 1e-3


def test_mlx_builds_a_forwards_window_mask_once():
    ops = make_ops("mlx", "float32", kv_dtype="float32")
    positions = _positions(8, 3, WINDOW + 2)
    first = ops._window_mask(WindowMask.of(8, 3, positions, WINDOW))
    assert ops._window_mask(WindowMask.of(8, 3, positions.copy(), WINDOW)) is first
    np.testing.assert_array_equal(np.array(first), causal_mask(8, 3, positions, WINDOW))
    later = ops._window_mask(WindowMask.of(11, 1, _positions(11, 1, WINDOW + 2), WINDOW))
    assert later is not first


def test_a_rings_append_hands_attention_its_window():
    ops = make_ops("numpy")
    ring = SlidingKV(ops, num_kv_heads=1, head_dim=4, window=WINDOW, slack=2)
    rows = np.zeros((1, 3, 4), np.float32)
    mask = ring.append(rows, rows)[2]
    assert isinstance(mask, WindowMask) and (mask.start, mask.rows, mask.window) == (0, 3, 5)
    np.testing.assert_array_equal(mask.key_positions(), [-1] * 7 + [0, 1, 2])
