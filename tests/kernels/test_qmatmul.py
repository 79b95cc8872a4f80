"""The packed-weight C kernel (kernels/csrc/) against the NumPy references in
kernels.qmatmul_ref, on each of its code paths (AVX-512, AVX2, portable C) the build has."""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np
import pytest

from kernels import qmatmul, qmatmul_ref
from kernels.ops import make_ops
from kernels.ops_numpy import NumpyOps
from kernels.qmatmul import QMatrix
from kernels.quantized import QuantizedWeight
from kernels.row_parts import RowParts

pytestmark = pytest.mark.skipif(
    not qmatmul.available(), reason="kernels._qmatmul is not built (pip install -e . builds it)"
)

TOL = 1e-5  # relative to the output's scale; float32 accumulation over k <= 1024
# NumpyOps here take cpu_matmul="float": these tests are of the float kernel (QMatrix);
# the int8 one has tests/kernels/test_int8_matmul.py.


def random_qmatrix(
    n: int, k: int, bits: int, group_size: int, seed: int = 0, dtype: type = np.float32
) -> QMatrix:
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**32, (n, k * bits // 32), dtype=np.uint64).astype(np.uint32)
    scales = (rng.standard_normal((n, k // group_size)) * 0.02).astype(dtype)
    biases = (rng.standard_normal((n, k // group_size)) * 0.1).astype(dtype)
    return QMatrix(words, scales, biases, group_size, bits)


def assert_close(got: np.ndarray, ref: np.ndarray) -> None:
    scale = max(float(np.abs(ref).max()), 1e-6)
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL * scale)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 9, 17, 100])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matmul_matches_reference(
    code_path: str, bits: int, group_size: int, m: int, dtype: type
) -> None:
    rng = np.random.default_rng(m * 100 + bits + group_size)
    k = group_size * int(rng.integers(1, 5))
    n = int(rng.choice([1, 3, 5, 37, 130]))  # odd sizes exercise the column tails
    qm = random_qmatrix(n, k, bits, group_size, seed=m, dtype=dtype)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = qmatmul.matmul(x, qm)
    assert got.shape == (m, n) and got.dtype == np.float32
    assert_close(got, qmatmul_ref.matmul_reference(x, qm))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("m", "k"), [(1, 512), (8, 512), (40, 512), (150, 4096)])
def test_parallel_split_matches_reference(
    code_path: str, threads: int, m: int, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big enough for the thread pool to split the columns into many chunks, and (150 rows
    of 4096) x into several row panels."""
    monkeypatch.setattr(qmatmul, "KERNEL_MAX_ROWS", 1000)
    qm = random_qmatrix(1030 if m < 100 else 70, k, 4, 32, seed=threads)
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    try:
        qmatmul.set_num_threads(threads)
        got = qmatmul.matmul(x, qm)
    finally:
        qmatmul.set_num_threads(qmatmul.default_num_threads())
    assert_close(got, qmatmul_ref.matmul_reference(x, qm))


def test_blocked_blas_path_matches_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many rows go through BLAS on the weight dequantized a block of rows at a time."""
    monkeypatch.setattr(qmatmul, "BLAS_BLOCK_ELEMENTS", 64 * 96)  # 64-row blocks of 96
    monkeypatch.setattr(qmatmul._scratch, "buf", None, raising=False)
    qm = random_qmatrix(150, 96, 8, 32)
    x = np.random.default_rng(1).standard_normal((qmatmul.KERNEL_MAX_ROWS + 5, 96))
    got = qmatmul.matmul(x.astype(np.float32), qm)
    assert_close(got, qmatmul_ref.matmul_reference(x, qm))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dequantize_and_embed_rows(code_path: str, bits: int, group_size: int, dtype: type) -> None:
    qm = random_qmatrix(41, group_size * 3, bits, group_size, dtype=dtype)
    ref = qmatmul_ref.dequantize_reference(qm)
    np.testing.assert_allclose(qmatmul.dequantize(qm), ref, rtol=1e-6, atol=1e-6)
    ids = np.array([5, 0, 40, 5, 17])
    np.testing.assert_allclose(qmatmul.embed_rows(qm, ids), ref[ids], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bits", [4, 8])
def test_reference_matches_mlx_layout(bits: int) -> None:
    """The reference reads MLX's packing: mx.quantize, then our dequantize == mx.dequantize."""
    w = mx.random.normal((24, 128), key=mx.random.key(bits))
    packed, scales, biases = mx.quantize(w, 64, bits)
    qm = QMatrix.from_arrays(packed, scales, biases, 64, bits)
    expected = np.array(mx.dequantize(packed, scales, biases, group_size=64, bits=bits))
    np.testing.assert_allclose(qmatmul_ref.dequantize_reference(qm), expected, rtol=0, atol=1e-6)


def test_scales_kept_in_float16_only_when_exact() -> None:
    qm = random_qmatrix(4, 64, 4, 32)
    s16, b16 = qm.scales.astype(np.float16), qm.biases.astype(np.float16)
    exact = QMatrix.from_arrays(qm.packed, s16.astype(np.float32), b16, 32, 4)
    assert exact.scales.dtype == np.float16 and exact.biases.dtype == np.float16
    inexact = QMatrix.from_arrays(qm.packed, s16, qm.biases, 32, 4)  # biases need float32
    assert inexact.scales.dtype == np.float32 and inexact.biases.dtype == np.float32
    subnormal = np.full_like(qm.scales, 1e-6, dtype=np.float16)  # half subnormals are exact
    tiny = QMatrix.from_arrays(qm.packed, subnormal, subnormal, 32, 4)
    assert tiny.scales.dtype == np.float16
    x = np.ones((1, 64), np.float32)
    assert_close(qmatmul.matmul(x, tiny), qmatmul_ref.matmul_reference(x, tiny))


def test_numpy_backend_without_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed build (no compiler) leaves the dense NumPy path, with equal results."""
    qw = QuantizedWeight(*mx.quantize(mx.random.normal((64, 128)), 32, 4), 32, 4)
    x = np.random.default_rng(0).standard_normal((2, 128)).astype(np.float32)
    want = NumpyOps(packed=True, cpu_matmul="float").linear(
        x, NumpyOps(packed=True, cpu_matmul="float").weight(qw)
    )
    monkeypatch.setattr(qmatmul, "_ext", None)
    assert not qmatmul.available() and not qmatmul.enabled()
    ops = NumpyOps()
    w = ops.weight(qw)
    assert isinstance(w, np.ndarray) and w.shape == (128, 64)  # dense [in, out]
    np.testing.assert_allclose(ops.linear(x, w), want, rtol=1e-5, atol=1e-5)


def test_switched_off_explicitly() -> None:
    assert not qmatmul.enabled(False) and not NumpyOps(packed=False).packed
    assert qmatmul.enabled(True) == qmatmul.available()
    ops = make_ops("numpy", qmatmul=False)
    qw = QuantizedWeight(*mx.quantize(mx.random.normal((64, 128)), 32, 4), 32, 4)
    w = ops.weight(qw)
    assert isinstance(w, np.ndarray) and w.shape == (128, 64)  # unpacked: dense [in, out]


def test_default_thread_count_is_the_usable_cores() -> None:
    n = qmatmul.default_num_threads()
    assert n >= 1
    if hasattr(os, "sched_getaffinity"):
        assert n == len(os.sched_getaffinity(0))


def test_bad_arguments_raise() -> None:
    qm = random_qmatrix(8, 64, 4, 32)
    ext = qmatmul._ext
    assert ext is not None
    with pytest.raises(ValueError, match="x must be"):
        ext.matmul(np.zeros((1, 64)), *qmatmul._args(qm), np.zeros((1, 8), np.float32))
    with pytest.raises(ValueError, match="do not match"):
        ext.matmul(np.zeros((1, 96), np.float32), *qmatmul._args(qm), np.zeros((1, 8), np.float32))
    with pytest.raises(IndexError):
        qmatmul.embed_rows(qm, np.array([8]))
    with pytest.raises(ValueError, match="bits"):
        QMatrix(qm.packed, qm.scales, qm.biases, 32, 7)
    with pytest.raises(ValueError, match="group_size"):
        QMatrix(qm.packed, qm.scales[:, :1], qm.biases[:, :1], 48, 4)


def test_numpy_ops_keep_quantized_weights_packed() -> None:
    """NumpyOps holds a QuantizedWeight packed, fuses packed rows, and matches the dense path."""
    rng = np.random.default_rng(3)
    mats = [rng.standard_normal((n, 64)).astype(np.float32) for n in (32, 16)]
    qws = [QuantizedWeight(*mx.quantize(mx.array(w), 32, 4), 32, 4) for w in mats]
    packed, dense = NumpyOps(packed=True, cpu_matmul="float"), NumpyOps(packed=False)
    fused = packed.concat_weights([packed.weight(w) for w in qws])
    assert isinstance(fused, QMatrix) and fused.shape == (48, 64)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    want = dense.linear(x, dense.concat_weights([dense.weight(w) for w in qws]))
    np.testing.assert_allclose(packed.linear(x, fused), want, rtol=1e-5, atol=1e-5)
    ids = np.array([3, 0, 31])
    np.testing.assert_allclose(
        packed.embed(packed.weight(qws[0]), ids), dense.embed(dense.weight(qws[0]), ids), atol=1e-6
    )
    mixed = packed.concat_weights([packed.weight(qws[0]), packed.weight(mats[1])])
    assert isinstance(mixed, RowParts) and mixed.rows == (32, 16)  # test_mixed_concat.py


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "Hq,Hkv,L,S,D,masked",
    [(9, 3, 1, 1, 64, False), (9, 3, 1, 700, 64, False), (9, 3, 6, 40, 64, True),
     (4, 2, 3, 17, 12, True), (8, 8, 16, 2000, 128, True), (2, 1, 1, 5, 256, False)],
)  # fmt: skip
def test_attention_matches_reference_on_cache_views(Hq, Hkv, L, S, D, masked, threads):
    """Views of a larger KV buffer (the cache's [:, :S]) go in as they are."""
    rng = np.random.default_rng(S)
    q = rng.standard_normal((Hq, L, D)).astype(np.float32)
    k_buf = rng.standard_normal((Hkv, S + 9, D)).astype(np.float32)
    v_buf = rng.standard_normal((Hkv, S + 9, D)).astype(np.float32)
    k, v = k_buf[:, :S], v_buf[:, :S]
    mask = None
    if masked:  # causal rows at the end, plus a hole: any boolean pattern is honoured
        mask = np.arange(S)[None, :] <= (S - L + np.arange(L))[:, None]
        mask[:, 0] = False if S > 1 else mask[:, 0]
    qmatmul.set_num_threads(threads)
    try:
        got = qmatmul.attention(q, k, v, D**-0.5, mask)
    finally:
        qmatmul.set_num_threads(qmatmul.default_num_threads())
    np.testing.assert_allclose(
        got, qmatmul_ref.attention_reference(q, k, v, D**-0.5, mask), atol=2e-5
    )


def test_attention_rows_do_not_depend_on_the_row_count() -> None:
    """Row i of a many-row call equals a call with row i alone, bit for bit."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((6, 8, 64)).astype(np.float32)
    k, v = (rng.standard_normal((2, 300, 64)).astype(np.float32) for _ in range(2))
    mask = np.arange(300)[None, :] <= (292 + np.arange(8))[:, None]
    rows = qmatmul.attention(q, k, v, 0.125, mask)
    for i in range(8):
        one = qmatmul.attention(q[:, i : i + 1], k, v, 0.125, mask[i : i + 1])
        np.testing.assert_array_equal(rows[:, i : i + 1], one)


def test_numpy_ops_attention_uses_the_kernel_for_few_rows(monkeypatch) -> None:
    ops = NumpyOps(packed=True, cpu_matmul="float")
    calls = []
    monkeypatch.setattr(qmatmul, "attention", lambda *a: calls.append(a) or np.zeros(a[0].shape))
    q = np.zeros((4, 2, 16), dtype=np.float32)
    kv = np.zeros((2, 8, 16), dtype=np.float32)
    ops.attention(q, kv, kv, 0.25, None)
    assert len(calls) == 1
    big = np.zeros((4, qmatmul.ATTENTION_MAX_ROWS + 1, 16), dtype=np.float32)
    kv = np.zeros((2, qmatmul.ATTENTION_MAX_ROWS + 1, 16), dtype=np.float32)
    ops.attention(big, kv, kv, 0.25, None)
    assert len(calls) == 1  # a prefill chunk stays on BLAS


def test_attention_bad_arguments_raise() -> None:
    q = np.zeros((4, 1, 16), dtype=np.float32)
    kv = np.zeros((2, 8, 16), dtype=np.float32)
    with pytest.raises(ValueError, match="shapes"):
        qmatmul.attention(q, kv[:, :, :8], kv, 0.25, None)
    with pytest.raises(ValueError, match="mask"):
        qmatmul.attention(q, kv, kv, 0.25, np.ones((2, 8), dtype=bool))
    with pytest.raises(ValueError, match="last axis"):
        qmatmul.attention(
            q, kv.transpose(0, 2, 1)[:, :8, :8].copy().transpose(0, 2, 1), kv, 0.25, None
        )


# -- any width and groups of 16 (GGUF's K-quants, Q5_0/Q5_1): kernels/csrc/matmul_any.c --


@pytest.mark.parametrize(
    "bits,group_size",
    [(b, g) for b in (2, 3, 5, 6) for g in (16, 32, 64)] + [(4, 16), (8, 16)],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_any_width_dequantize_is_exact(
    code_path: str, bits: int, group_size: int, dtype: type
) -> None:
    """Each weight is s * q + b rounded once (an FMA), as the float64 reference rounded to
    float32 is: equal bit for bit, for whole matrices and for embedding rows."""
    qm = random_qmatrix(37, 256, bits, group_size, seed=bits * 100 + group_size, dtype=dtype)
    want = qmatmul_ref.dequantize_reference(qm).astype(np.float32)
    assert np.array_equal(qmatmul.dequantize(qm).view(np.uint32), want.view(np.uint32))
    rows = np.array([36, 0, 17, 36])
    assert np.array_equal(qmatmul.embed_rows(qm, rows), want[rows])


@pytest.mark.parametrize(
    "bits,group_size", [(2, 16), (3, 16), (5, 32), (6, 16), (6, 64), (4, 16), (8, 16)]
)
@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 17, 70])
def test_any_width_matmul_matches_reference(
    code_path: str, bits: int, group_size: int, m: int
) -> None:
    """m <= 8: one register tile; 9, 17: several row blocks; 70: the dequantize + BLAS path.
    n = 37 leaves a ragged last column run; the last row's last chunk ends the buffer."""
    qm = random_qmatrix(37, 512, bits, group_size, seed=m, dtype=np.float16)
    x = np.random.default_rng(m).standard_normal((m, 512)).astype(np.float32)
    assert_close(qmatmul.matmul(x, qm), qmatmul_ref.matmul_reference(x, qm))


def test_any_width_concat_keeps_rows() -> None:
    a = random_qmatrix(5, 64, 6, 16, seed=1)
    b = random_qmatrix(3, 64, 6, 16, seed=2, dtype=np.float16)  # float32 + float16 factors
    both = a.concat([b])
    want = np.concatenate([qmatmul.dequantize(a), qmatmul.dequantize(b)])
    assert both.shape == (8, 64) and both.scales.dtype == np.float32
    assert np.array_equal(qmatmul.dequantize(both), want)
