"""The matmul attention a CUDA GPU gives a verify's or a block pass's few query rows
(kernels/few_query_attention.py): equal to a float64 reference and to MLX's own fused
attention for every mask kind and grouped heads, and taken by `MlxOps.attention` on CUDA
for 2..32 query rows only."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kernels import few_query_attention as fqa
from kernels.masks import CausalMask, WindowMask
from kernels.ops_mlx import MlxOps


def reference(q, k, v, scale, allowed, bias=None):
    """float64 softmax attention; q [H, L, Dh], k, v [KVH, S, Dh], allowed [L, S]."""
    H, L, _ = q.shape
    group = H // k.shape[0]
    out = np.empty(q.shape)
    for h in range(H):
        s = q[h].astype(np.float64) @ k[h // group].astype(np.float64).T * scale
        s = s + (0.0 if bias is None else bias)
        s = np.where(allowed, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[h] = (p / p.sum(-1, keepdims=True)) @ v[h // group]
    return out


def inputs(heads, kv_heads, rows, keys, dh=64, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((heads, rows, dh)).astype(np.float32)
    k = rng.standard_normal((kv_heads, keys, dh)).astype(np.float32)
    v = rng.standard_normal((kv_heads, keys, dh)).astype(np.float32)
    return q, k, v


def causal(rows, keys):
    return np.arange(keys)[None, :] <= np.arange(keys - rows, keys)[:, None]


@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize(("rows", "keys"), [(2, 2), (7, 40), (16, 301)])
@pytest.mark.parametrize("kind", ["causal", "none", "bool", "additive"])
def test_equals_the_float64_reference_and_mlx_fused_attention(
    heads, kv_heads, rows, keys, kind
) -> None:
    q, k, v = inputs(heads, kv_heads, rows, keys, seed=rows * keys)
    scale = 64**-0.5
    allowed, bias = np.ones((rows, keys), bool), None
    mask: object = None
    if kind == "causal":
        allowed, mask = causal(rows, keys), "causal"
    elif kind == "bool":  # a sliding window's shape: a few keys before each row's own
        allowed = causal(rows, keys)
        allowed[:, : max(0, keys - rows - 4)] = False
        mask = mx.array(allowed)
    elif kind == "additive":
        bias = np.random.default_rng(3).standard_normal((rows, keys)).astype(np.float32)
        mask = mx.array(bias)
    args = [mx.array(a)[None] for a in (q, k, v)]
    got = np.array(fqa.few_query_attention(*args, scale, mask)[0])
    want = reference(q, k, v, scale, allowed, bias)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    fused = mx.fast.scaled_dot_product_attention(*args, scale=scale, mask=mask)
    np.testing.assert_allclose(got, np.array(fused[0]), rtol=1e-5, atol=1e-5)
    if kind == "causal" and rows > 1:  # the mask is applied: the first row reads fewer keys
        unmasked = np.array(fqa.few_query_attention(*args, scale, None)[0])
        assert np.abs(unmasked[:, 0] - got[:, 0]).max() > 1e-3


def test_half_precision_caches_give_their_dtype_and_float32_arithmetic() -> None:
    q, k, v = inputs(9, 3, 16, 200, seed=5)
    args = [mx.array(a).astype(mx.bfloat16)[None] for a in (q, k, v)]
    out = fqa.few_query_attention(*args, 0.125, "causal")
    assert out.dtype == mx.bfloat16 and out.shape == (1, 9, 16, 64)
    rounded = [np.array(a[0].astype(mx.float32)) for a in args]
    want = reference(*rounded, 0.125, causal(16, 200))
    # only the output's rounding to bfloat16 (8 bits) is left
    np.testing.assert_allclose(np.array(out[0].astype(mx.float32)), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    ("rows", "max_scores", "taken"),
    [
        (1, None, False),
        (2, None, True),
        (32, 0, True),
        (33, None, True),
        (33, 6 * 33 * 83, True),
        (33, 6 * 33 * 83 - 1, False),
    ],
)
def test_mlx_ops_on_cuda_takes_it_for_rows_whose_scores_fit(
    monkeypatch, rows, max_scores, taken
) -> None:
    """More than one row and at most 32, or [heads, rows, keys] scores within MAX_SCORES."""
    if max_scores is not None:
        monkeypatch.setattr(fqa, "MAX_SCORES", max_scores)
    calls = []
    original = fqa.few_query_attention

    def counted(*args):
        calls.append(args[0].shape)
        return original(*args)

    monkeypatch.setattr(fqa, "few_query_attention", counted)
    ops = MlxOps("float32")
    ops._cuda = True  # what the CUDA backend sets; the arithmetic is the CPU's here
    q, k, v = inputs(6, 2, rows, rows + 50, seed=rows)
    masks = [CausalMask(50, rows), WindowMask.of(50, rows, np.arange(rows + 50), 20)]
    for mask in masks:
        got = np.array(ops.attention(mx.array(q), mx.array(k), mx.array(v), 0.125, mask))
        allowed = causal(rows, rows + 50)
        if isinstance(mask, WindowMask):
            allowed = np.array(ops._window_mask(mask))
        np.testing.assert_allclose(got, reference(q, k, v, 0.125, allowed), atol=2e-5)
    assert len(calls) == (2 if taken else 0)
    ops._cuda = False  # off CUDA (the CPU, Metal): MLX's own attention every time
    ops.attention(mx.array(q), mx.array(k), mx.array(v), 0.125, masks[0])
    assert len(calls) == (2 if taken else 0)
