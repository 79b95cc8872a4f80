"""The one-launch prefill attention (kernels/prefill_attention_cuda.py): on a CUDA GPU its
rows against a float64 reference for every head size it is built for, grouped heads, rows
that do not fill a block and prefixes of other lengths; everywhere, which chunks
`MlxOps.attention` hands it when it is on, and what it refuses."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kernels import few_query_attention as fqa
from kernels import prefill_attention_cuda as pac
from kernels.masks import CausalMask, WindowMask
from kernels.ops_mlx import MlxOps
from tests.kernels.test_few_query_attention import causal, inputs, reference

needs_cuda = pytest.mark.skipif(not pac.is_available(), reason="needs MLX on a CUDA GPU")


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dh"), [(9, 3, 64), (32, 8, 128), (8, 2, 256), (4, 1, 256)]
)
@pytest.mark.parametrize(("rows", "keys"), [(1, 1), (33, 33), (100, 300), (17, 1000), (600, 600)])
def test_rows_equal_the_float64_reference(heads, kv_heads, dh, rows, keys):
    q, k, v = inputs(heads, kv_heads, rows, keys, dh=dh, seed=rows + keys)
    scale = dh**-0.5
    got = pac.prefill_attention(*(mx.array(a)[None] for a in (q, k, v)), scale)
    assert got.shape == (1, heads, rows, dh) and got.dtype == mx.float32
    want = reference(q, k, v, scale, causal(rows, keys))
    np.testing.assert_allclose(np.array(got[0]), want, rtol=1e-4, atol=1e-4)


@needs_cuda
@pytest.mark.gpu
def test_bfloat16_caches_round_only_the_output():
    q, k, v = inputs(9, 3, 300, 700, seed=7)
    args = [mx.array(a).astype(mx.bfloat16)[None] for a in (q, k, v)]
    got = pac.prefill_attention(*args, 0.125, tensor_cores=False)  # the scalar body
    assert got.dtype == mx.bfloat16
    rounded = [np.array(a[0].astype(mx.float32)) for a in args]
    want = reference(*rounded, 0.125, causal(300, 700))
    np.testing.assert_allclose(np.array(got[0].astype(mx.float32)), want, rtol=1e-2, atol=1e-2)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize(("heads", "kv_heads", "dh"), [(9, 3, 64), (32, 8, 128), (4, 4, 64)])
@pytest.mark.parametrize(
    ("rows", "keys"), [(33, 33), (64, 64), (100, 300), (17, 1000), (600, 600), (130, 2100)]
)
def test_the_tensor_core_body_equals_the_reference_on_its_rounded_inputs(
    dtype, heads, kv_heads, dh, rows, keys
):
    """Half-precision K/V of head size 64 or 128: the tensor-core body. Its softmax weights
    are rounded to the dtype before they meet V, so the bound is the dtype's, ~2^-8 of a
    weight, which a row of another row's (or a key too many) would far exceed."""
    q, k, v = inputs(heads, kv_heads, rows, keys, dh=dh, seed=3 * rows + keys)
    args = [mx.array(a).astype(dtype)[None] for a in (q, k, v)]
    assert pac.on_tensor_cores(args[1])
    scale = dh**-0.5
    got = pac.prefill_attention(*args, scale)
    assert got.shape == (1, heads, rows, dh) and got.dtype == dtype
    rounded = [np.array(a[0].astype(mx.float32)) for a in args]
    want = reference(*rounded, scale, causal(rows, keys))
    got = np.array(got[0].astype(mx.float32))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    # the bound catches a one-row error: each row's neighbour's answer lies outside it
    assert np.abs(got[:, :-1] - want[:, 1:]).max() > 0.1


def test_a_shape_it_is_not_built_for_is_refused():
    q, k, v = (mx.array(a)[None] for a in inputs(4, 2, 40, 50, dh=96))
    assert not pac.takes(q, k)
    with pytest.raises(ValueError, match="head sizes"):
        pac.prefill_attention(q, k, v, 0.1)
    q, k, v = (mx.array(a)[None] for a in inputs(4, 2, 60, 50))  # more rows than keys
    assert not pac.takes(q, k)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("enabled", [False, True])
def test_mlx_ops_on_cuda_hands_it_causal_chunks_past_the_few_rows(monkeypatch, enabled, dtype):
    """On: a causal chunk of more than FEW_QUERY_ROWS rows with half-precision K/V goes to
    the kernel (its tensor-core body), whatever its scores' size; float32 K/V (the scalar
    body's), a verify's rows and a sliding window's mask do not."""
    calls = []

    def kernel(q, k, v, scale):  # the CPU has no CUDA: the matmuls' rows, counted
        calls.append(q.shape)
        return fqa.few_query_attention(q, k, v, scale, "causal")

    monkeypatch.setattr(pac, "ENABLED", enabled)
    monkeypatch.setattr(pac, "prefill_attention", kernel)
    monkeypatch.setattr(fqa, "MAX_SCORES", 0)  # past the matmuls' bound: cuDNN's, off
    ops = MlxOps(dtype)
    ops._cuda = True  # what the CUDA backend sets; the arithmetic is the CPU's here
    half = dtype == "bfloat16"
    for rows, mask, taken in [
        (40, CausalMask(10, 40), enabled and half),
        (8, CausalMask(10, 8), False),
        (40, WindowMask.of(10, 40, np.arange(50), 20), False),
    ]:
        q, k, v = (mx.array(a).astype(ops.dtype) for a in inputs(6, 2, rows, rows + 10, seed=rows))
        before = len(calls)
        got = np.array(ops.attention(q, k, v, 0.125, mask).astype(mx.float32))
        allowed = causal(rows, rows + 10)
        if isinstance(mask, WindowMask):
            allowed = np.array(ops._window_mask(mask))
        want = reference(*(np.array(a.astype(mx.float32)) for a in (q, k, v)), 0.125, allowed)
        np.testing.assert_allclose(got, want, atol=2e-2 if half else 2e-5)
        assert len(calls) - before == int(taken)
