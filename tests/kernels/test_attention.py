"""The C attention kernel (kernels/csrc/attention.c) on each code path the build has,
against the float64 reference kernels.qmatmul_ref.attention_reference on the same
(float16-rounded) K/V: float16 and float32 caches, GQA groups 1, 3 and 4, head dims 64
and 256 (and 12, which only the portable tiles take), causal, window and ring masks.
Rows are computed alone: a row is bit-identical whatever the other rows and threads."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from kernels import qmatmul, qmatmul_ref
from kernels.ops_numpy import NumpyOps

pytestmark = pytest.mark.skipif(
    not qmatmul.available(), reason="kernels._qmatmul is not built (pip install -e . builds it)"
)

# float32 accumulation over <= 8192 keys of <= 256 dims, relative to the output's scale
TOL = 2e-5
BLOCK = 64  # ATTN_BLOCK in attention.c: keys per unit of work


@pytest.fixture(params=[1, 2])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    qmatmul.set_num_threads(request.param)
    yield request.param
    qmatmul.set_num_threads(qmatmul.default_num_threads())


def cache_views(
    Hkv: int, S: int, D: int, dtype: type, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """k, v: [Hkv, S, D] views of [Hkv, capacity, D] buffers, as the KV cache hands them."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((Hkv, S + 7, D)).astype(dtype)
    v = rng.standard_normal((Hkv, S + 7, D)).astype(dtype)
    return k[:, :S], v[:, :S]


def causal(L: int, S: int, window: int = 0) -> np.ndarray:
    """bool [L, S]: the last L keys are the rows' own positions."""
    pos = S - L + np.arange(L)[:, None]
    keys = np.arange(S)[None, :]
    mask = keys <= pos
    return mask & (keys > pos - window) if window else mask


def ring_mask(L: int, size: int, window: int, start: int) -> np.ndarray:
    """What engine/sliding_kv.py hands over: a ring of `size` rows (slot i holds the latest
    position congruent to i, or none yet) followed by the L new rows, window-masked."""
    slots = np.arange(size)
    newest = start - 1 - (start - 1 - slots) % size
    ring = np.where(newest >= 0, newest, -1)
    positions = np.concatenate([ring, np.arange(start, start + L)])
    q = np.arange(start, start + L)[:, None]
    return (positions[None] <= q) & (positions[None] >= 0) & (positions[None] > q - window)


def check(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    D = q.shape[-1]
    got = qmatmul.attention(q, k, v, D**-0.5, mask)
    ref = qmatmul_ref.attention_reference(q, k, v, D**-0.5, mask)
    scale = max(float(np.abs(ref).max()), 1e-6)
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL * scale)
    return got


SHAPES = [(9, 3, 64), (4, 1, 256), (4, 4, 64), (6, 2, 12), (3, 1, 24)]  # Hq, Hkv, D


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("Hq,Hkv,D", SHAPES)
@pytest.mark.parametrize("L,S", [(1, 1), (1, 63), (1, 65), (3, 200), (8, 1000), (40, 130)])
def test_matches_reference_causal(code_path, threads, dtype, Hq, Hkv, D, L, S):
    rng = np.random.default_rng(L * S)
    q = rng.standard_normal((Hq, L, D)).astype(np.float32)
    k, v = cache_views(Hkv, S, D, dtype, seed=S)
    check(q, k, v, causal(L, S) if L > 1 else None)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("Hq,Hkv,D", [*SHAPES, (8, 1, 128)])
@pytest.mark.parametrize("L,S,window", [(65, 65, 0), (100, 1000, 0), (256, 2048, 512)])
def test_matches_reference_on_prefill_chunks(code_path, dtype, Hq, Hkv, D, L, S, window):
    """Past ATTENTION_MAX_ROWS rows the AVX-512 build takes its prefill tiles (head dims
    64, 128, 256), the others its decode tiles: causal and sliding-window chunks."""
    rng = np.random.default_rng(L + S)
    q = rng.standard_normal((Hq, L, D)).astype(np.float32)
    k, v = cache_views(Hkv, S, D, dtype, seed=L)
    check(q, k, v, causal(L, S, window))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("Hq,Hkv,D", SHAPES[:2])
def test_matches_reference_on_a_long_context(code_path, dtype, Hq, Hkv, D):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((Hq, 2, D)).astype(np.float32) * 2  # peaked softmax rows
    k, v = cache_views(Hkv, 8192, D, dtype)
    check(q, k, v, causal(2, 8192))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("Hq,Hkv,D", SHAPES[:2])
@pytest.mark.parametrize("L,start", [(1, 700), (4, 700), (6, 20)])
def test_matches_reference_on_a_sliding_ring(code_path, threads, dtype, Hq, Hkv, D, L, start):
    """A window-512 ring of 520 slots in ring order, then the new rows: keys out of the
    window, and slots not written yet, are masked; unwritten slots hold NaN, never read."""
    size = 520
    rng = np.random.default_rng(start)
    q = rng.standard_normal((Hq, L, D)).astype(np.float32)
    k, v = cache_views(Hkv, size + L, D, dtype, seed=start)
    mask = ring_mask(L, size, 512, start)
    unwritten = ~mask.any(axis=0)
    k[:, unwritten], v[:, unwritten] = np.nan, np.inf
    got = qmatmul.attention(q, k, v, D**-0.5, mask)
    seen = ~unwritten  # the reference on the keys some row sees
    ref = qmatmul_ref.attention_reference(q, k[:, seen], v[:, seen], D**-0.5, mask[:, seen])
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL * float(np.abs(ref).max()))


def test_any_mask_pattern_is_honoured(code_path) -> None:
    """Holes anywhere (a whole block, single keys, a row's last key only)."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((9, 5, 64)).astype(np.float32)
    k, v = cache_views(3, 300, 64, np.float16)
    mask = rng.random((5, 300)) < 0.3
    mask[:, BLOCK : 2 * BLOCK] = False
    mask[3] = False
    mask[3, 299] = True
    check(q, k, v, mask)


def test_a_row_that_sees_no_key_is_zero(code_path) -> None:
    q = np.ones((4, 2, 64), dtype=np.float32)
    k, v = cache_views(1, 100, 64, np.float16)
    mask = np.zeros((2, 100), dtype=bool)
    mask[1, 50] = True
    got = qmatmul.attention(q, k, v, 0.125, mask)
    np.testing.assert_array_equal(got[:, 0], 0.0)
    np.testing.assert_array_equal(got[:, 1], np.broadcast_to(v[0, 50].astype(np.float32), (4, 64)))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("Hq,Hkv,D", SHAPES[:3])
def test_verify_rows_equal_decode_steps_bit_for_bit(code_path, dtype, Hq, Hkv, D):
    """Row i of an 8-row causal verify over S keys equals a decode step over its own
    S - 7 + i keys with no mask, on 1 and on 2 threads: speculation stays exact."""
    rng = np.random.default_rng(D)
    S, L = 1000, 8
    q = rng.standard_normal((Hq, L, D)).astype(np.float32)
    k, v = cache_views(Hkv, S, D, dtype)
    results = []
    for n in (1, 2):
        qmatmul.set_num_threads(n)
        try:
            rows = qmatmul.attention(q, k, v, D**-0.5, causal(L, S))
            for i in range(L):
                visible = S - L + i + 1
                one = qmatmul.attention(
                    q[:, i : i + 1], k[:, :visible], v[:, :visible], D**-0.5, None
                )
                np.testing.assert_array_equal(rows[:, i : i + 1], one)
        finally:
            qmatmul.set_num_threads(qmatmul.default_num_threads())
        results.append(rows)
    np.testing.assert_array_equal(results[0], results[1])


def test_rows_do_not_depend_on_the_other_rows(code_path) -> None:
    """Row i of a many-row call equals row i alone with its own mask row, bit for bit."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((4, 8, 256)).astype(np.float32)
    k, v = cache_views(1, 3000, 256, np.float16)
    mask = causal(8, 3000, window=512)
    rows = qmatmul.attention(q, k, v, 0.0625, mask)
    for i in range(8):
        one = qmatmul.attention(q[:, i : i + 1], k, v, 0.0625, mask[i : i + 1])
        np.testing.assert_array_equal(rows[:, i : i + 1], one)


def test_float16_cache_reads_equal_its_float32_widening(code_path) -> None:
    """float16 rows are widened exactly: the same numbers as a float32 copy, bit for bit."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((9, 3, 64)).astype(np.float32)
    k, v = cache_views(3, 777, 64, np.float16)
    mask = causal(3, 777)
    np.testing.assert_array_equal(
        qmatmul.attention(q, k, v, 0.125, mask),
        qmatmul.attention(q, k.astype(np.float32), v.astype(np.float32), 0.125, mask),
    )


def test_numpy_ops_send_float16_and_float32_rows_to_the_kernel(monkeypatch) -> None:
    ops = NumpyOps(packed=True)
    calls = []
    monkeypatch.setattr(qmatmul, "attention", lambda *a: calls.append(a) or np.zeros(a[0].shape))
    q = np.zeros((4, 2, 16), dtype=np.float32)
    for dtype in (np.float16, np.float32):
        kv = np.zeros((2, 8, 16), dtype=dtype)
        ops.attention(q, kv, kv, 0.25, None)
    assert [a[1].dtype for a in calls] == [np.float16, np.float32]


def test_numpy_ops_send_prefill_chunks_where_the_prefill_tiles_are_built(monkeypatch) -> None:
    ops = NumpyOps(packed=True)
    calls = []
    monkeypatch.setattr(qmatmul, "attention", lambda *a: calls.append(a) or np.zeros(a[0].shape))
    kv = np.zeros((2, 300, 64), dtype=np.float16)
    ops.attention(np.zeros((4, 256, 64), dtype=np.float32), kv, kv, 0.125, None)
    assert len(calls) == (qmatmul._ext.info()["isa"] == "avx512")
    odd = np.zeros((2, 300, 48), dtype=np.float32)  # not a multiple of 64: NumPy's BLAS
    ops.attention(np.zeros((4, 256, 48), dtype=np.float32), odd, odd, 0.125, None)
    assert len(calls) <= 1


def test_bad_arguments_raise() -> None:
    q = np.zeros((4, 1, 16), dtype=np.float32)
    kv = np.zeros((2, 8, 16), dtype=np.float32)
    kv16 = kv.astype(np.float16)
    with pytest.raises(ValueError, match="one dtype"):
        qmatmul.attention(q, kv16, kv, 0.25, None)
    with pytest.raises(ValueError, match="float32 or float16"):
        qmatmul.attention(q, kv.astype(np.float64), kv.astype(np.float64), 0.25, None)
    with pytest.raises(ValueError, match="last axis"):
        qmatmul.attention(q, kv16[:, :, ::2], kv16[:, :, ::2], 0.25, None)
    with pytest.raises(ValueError, match="shapes"):
        qmatmul.attention(q, kv16[:, :4], kv16, 0.25, None)
    with pytest.raises(ValueError, match="shapes"):
        qmatmul.attention(np.zeros((3, 1, 16), dtype=np.float32), kv16, kv16, 0.25, None)
    with pytest.raises(ValueError, match="mask"):
        qmatmul.attention(q, kv16, kv16, 0.25, np.ones((1, 9), dtype=bool))
    big = np.zeros((1, 1, 520), dtype=np.float32)
    with pytest.raises(ValueError, match="head dim 520"):
        qmatmul.attention(big, big.astype(np.float16), big.astype(np.float16), 0.1, None)
