"""The CUDA recurrence against the float64 reference; runs only where MLX has CUDA (the
lent GPU machine), and skips cleanly on the CPU suite."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import gated_delta_cuda
from kernels.gated_delta_ref import gated_delta_reference

pytestmark = pytest.mark.skipif(
    not gated_delta_cuda.is_available(), reason="needs MLX on a CUDA GPU"
)


def _inputs(L, H, Dk, Dv, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((L, H, Dk)).astype(np.float32)
    k = rng.standard_normal((L, H, Dk)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(Dk)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((L, H, Dv)).astype(np.float32)
    g = -np.logaddexp(0, rng.standard_normal((L, H))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((L, H))))).astype(np.float32)
    state = (0.1 * rng.standard_normal((H, Dk, Dv))).astype(np.float32)
    return q, k, v, g, beta, state


@pytest.mark.gpu
@pytest.mark.parametrize("L", [1, 3, 16])
@pytest.mark.parametrize("shape", [(4, 32, 48), (16, 128, 128)])
def test_cuda_recurrent_matches_reference(L, shape):
    import mlx.core as mx

    H, Dk, Dv = shape
    arrays = _inputs(L, H, Dk, Dv)
    o_ref, s_ref = gated_delta_reference(*arrays)
    o, s = gated_delta_cuda.gated_delta_recurrent(*(mx.array(a) for a in arrays))
    np.testing.assert_allclose(np.array(o), o_ref, atol=1e-4)
    np.testing.assert_allclose(np.array(s), s_ref, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("pair", [None, 2, 4, 8])
@pytest.mark.parametrize("L", [64, 300, 2048])
def test_one_build_takes_a_prefill_chunks_rows(L, pair):
    """The row count is read from q's shape, not built in: a prefill chunk's hundreds of
    rows (BRANCHCHAT_GDN_PREFILL=recurrent) within float32's tolerance of the reference,
    with any number of threads a value column."""
    import mlx.core as mx

    arrays = _inputs(L, 16, 128, 128, seed=L)
    o_ref, s_ref = gated_delta_reference(*arrays)
    o, s = gated_delta_cuda.gated_delta_recurrent(*(mx.array(a) for a in arrays), pair=pair)
    assert o.shape == (L, 16, 128)
    scale = max(1.0, float(np.abs(s_ref).max()))
    np.testing.assert_allclose(np.array(o), o_ref, atol=1e-4 * scale)
    np.testing.assert_allclose(np.array(s), s_ref, atol=1e-4 * scale)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 32, 48), (2, 256, 64)])
def test_the_prefills_threads_a_column_give_the_references_rows(shape, monkeypatch):
    """gated_delta_prefill at each PREFILL_PAIR, with and without PREFILL_PREFETCH,
    including a Dv that leaves a block's last columns empty (48) and the widest key head
    the kernel takes (256)."""
    import mlx.core as mx

    H, Dk, Dv = shape
    arrays = _inputs(100, H, Dk, Dv, seed=Dk)
    o_ref, s_ref = gated_delta_reference(*arrays)
    inputs = [mx.array(a) for a in arrays]
    for pair in (1, 2, 4, 8):
        monkeypatch.setattr(gated_delta_cuda, "PREFILL_PAIR", pair)
        replay = gated_delta_cuda.gated_delta_recurrent(*inputs, pair=pair)
        for ahead in (False, True):
            monkeypatch.setattr(gated_delta_cuda, "PREFILL_PREFETCH", ahead)
            o, s = gated_delta_cuda.gated_delta_prefill(*inputs)
            np.testing.assert_allclose(np.array(o), o_ref, atol=1e-4)
            np.testing.assert_allclose(np.array(s), s_ref, atol=1e-4)
            # fetching a row ahead changes no arithmetic: the replay kernel's bits
            np.testing.assert_array_equal(np.array(o), np.array(replay[0]))
            np.testing.assert_array_equal(np.array(s), np.array(replay[1]))


def test_a_pair_that_is_not_a_power_of_two_is_refused():
    import mlx.core as mx

    arrays = [mx.array(a) for a in _inputs(4, 2, 32, 32)]
    with pytest.raises(ValueError, match="power of two"):
        gated_delta_cuda.gated_delta_recurrent(*arrays, pair=3)
