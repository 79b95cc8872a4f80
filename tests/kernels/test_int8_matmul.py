"""The integer-dot-product kernel (kernels/csrc/int8*.c) against its NumPy definition in
kernels.int8_ref, on every code path this CPU runs (AVX-512 VNNI, AVX-VNNI, AVX2,
portable C), and the tiled layout against the GGUF types it is built from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from kernels import gguf_quants, int8_matmul, int8_ref, qmatmul
from kernels.gguf_quants import pack_bits
from kernels.int8_matmul import Int8Matrix
from kernels.ops_numpy import NumpyOps
from kernels.qmatmul import QMatrix
from kernels.quantized import QuantizedWeight, dequantize, quantize_q8_0
from kernels.row_parts import RowParts
from tests.kquant_blocks import encode

pytestmark = pytest.mark.skipif(
    not int8_matmul.available(), reason="kernels._qmatmul is not built (pip install -e .)"
)

# The kernel does the reference's integer sums exactly and its float steps in the same
# order; the reference's fma is a float64 sum rounded once, which can differ from a fused
# one by an ulp (a double rounding): a few float32 ulps of the output's scale.
TOL = 4 * float(np.finfo(np.float32).eps)
SYMMETRIC_ZERO = {"Q4_0": 8, "Q5_0": 16, "Q8_0": 128, "Q3_K": 4, "Q6_K": 32}
GGUF_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


@pytest.fixture(params=int8_matmul.PATHS)
def int8_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test runs on every code path this CPU has (the kernel picks the best)."""
    info = int8_matmul.info()
    if request.param not in info["supported"]:
        pytest.skip(f"this CPU cannot run the {request.param} path")
    int8_matmul.set_path(request.param)
    yield request.param
    int8_matmul.set_path(info["path"])


def random_case(
    n: int, k: int, bits: int, group_size: int, seed: int = 0, dtype: type = np.float16
) -> tuple[np.ndarray, np.ndarray, np.ndarray, QMatrix]:
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 2**bits, (n, k), dtype=np.uint8)
    scales = (rng.standard_normal((n, k // group_size)) * 0.02).astype(dtype)
    biases = (rng.standard_normal((n, k // group_size)) * 0.1).astype(dtype)
    return q, scales, biases, QMatrix(pack_bits(q, bits), scales, biases, group_size, bits)


def assert_close(got: np.ndarray, ref: np.ndarray) -> None:
    scale = max(float(np.abs(ref).max()), 1e-30)
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL * scale)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group_size", [16, 32, 64])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_matmul_matches_reference(int8_path: str, bits: int, group_size: int, dtype: type) -> None:
    n, k = 72, 256  # 72 rows: a padded last tile
    q, scales, biases, qm = random_case(n, k, bits, group_size, seed=bits, dtype=dtype)
    w = Int8Matrix.from_qmatrix(qm)
    x = np.random.default_rng(1).standard_normal((5, k)).astype(np.float32)
    x[2, 32:64] = 0.0  # a block whose d is 0
    got = int8_matmul.matmul(x, w)
    assert got.shape == (5, n)
    assert_close(got, int8_ref.matmul_reference(x, q, scales, biases, group_size, bits))


def test_quantization_is_the_reference_bit_for_bit(int8_path: str) -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 128)) * np.logspace(-30, 30, 4)[:, None]).astype(np.float32)
    x[0, :32] = 0.0
    ties = [127.0, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5]  # max 127: d = 1, so x * (1 / d) = x
    x[1, :32] = 0.0
    x[1, : len(ties)] = ties
    x[1, 32:64] = 127.0 * np.sign(np.arange(32) - 15.5) / np.arange(1, 33)
    for levels in (1, 2):
        for group_size in (16, 32, 64):
            xq, d, xb = int8_matmul.quantize_x(x, group_size, levels)
            want_xq, want_d = int8_ref.quantize_levels(x, levels)
            assert np.array_equal(xq, want_xq)
            assert np.array_equal(d.view(np.uint32), want_d.view(np.uint32))
            want_xb = int8_ref.bias_sums(want_xq, want_d, group_size)
            np.testing.assert_allclose(xb, want_xb, rtol=TOL, atol=0)
    assert xq[0, 1, : len(ties)].tolist() == [127, 2, 4, -2, 0, 0, 2]  # halves to even
    assert not xq[:, 0, :32].any() and not d[:, 0, 0].any()
    # the second level carries what the first rounded away: ~2^-15 of the block's max
    approx = (d[0].repeat(32, axis=1) * xq[0] + d[1].repeat(32, axis=1) * xq[1]).astype(np.float64)
    block_max = np.abs(x).reshape(4, 4, 32).max(axis=-1).repeat(32, axis=1)
    assert np.all(np.abs(approx - x) <= block_max / (127 * 254) * 1.01)


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_rows_do_not_depend_on_row_count_or_threads(int8_path: str, bits: int) -> None:
    """A verify's rows equal single decode steps bit for bit (speculation stays exact)."""
    *_, qm = random_case(200, 320, bits, 16 if bits == 6 else 32, seed=3)
    w = Int8Matrix.from_qmatrix(qm)
    x = np.random.default_rng(4).standard_normal((300, 320)).astype(np.float32)
    threads = qmatmul._ext.get_num_threads()
    try:
        qmatmul.set_num_threads(2)
        full = int8_matmul.matmul(x, w)
        qmatmul.set_num_threads(1)
        assert np.array_equal(int8_matmul.matmul(x, w), full)
    finally:
        qmatmul.set_num_threads(threads)
    for m in (1, 8, 37):
        for start in (0, 5, 300 - m):
            assert np.array_equal(
                int8_matmul.matmul(x[start : start + m], w), full[start : start + m]
            )


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group_size", [16, 32, 64])
def test_every_register_tile_gives_a_row_its_single_row_bits(
    int8_path: str, bits: int, group_size: int
) -> None:
    """m = 1..17 meets every register tile (1 to 8 rows a pass and each remainder; 4, 2
    and 1 tiles: 100 rows are 7 tiles, the pool's runs of 4 and 3, the last one partial):
    each row equals that row alone bit for bit, and the reference."""
    q, scales, biases, qm = random_case(100, 128, bits, group_size, seed=13 + bits)
    w = Int8Matrix.from_qmatrix(qm)
    x = np.random.default_rng(14).standard_normal((17, 128)).astype(np.float32)
    x[3, 64:96] = 0.0  # a block whose d is 0
    alone = np.concatenate([int8_matmul.matmul(x[i : i + 1], w) for i in range(17)])
    assert_close(alone, int8_ref.matmul_reference(x, q, scales, biases, group_size, bits))
    for m in range(2, 18):
        assert np.array_equal(int8_matmul.matmul(x[:m], w), alone[:m]), m


def test_out_may_be_columns_of_a_wider_array(int8_path: str) -> None:
    *_, qm = random_case(48, 64, 4, 32)
    w = Int8Matrix.from_qmatrix(qm)
    x = np.random.default_rng(5).standard_normal((3, 64)).astype(np.float32)
    wide = np.full((3, 80), 7.0, dtype=np.float32)
    int8_matmul.matmul(x, w, out=wide[:, 16:64])
    assert np.array_equal(wide[:, 16:64], int8_matmul.matmul(x, w))
    assert np.all(wide[:, :16] == 7.0) and np.all(wide[:, 64:] == 7.0)


@pytest.mark.parametrize("bits", [3, 4, 5, 6, 8])
def test_layout_round_trips_and_dequantizes_as_qmatrix(bits: int) -> None:
    q, scales, biases, qm = random_case(40, 128, bits, 16)
    w = Int8Matrix.from_qmatrix(qm)
    assert np.array_equal(w.q(), q)
    s, b = w.params()
    assert np.array_equal(s, scales) and np.array_equal(b, biases)
    assert np.array_equal(int8_matmul.dequantize(w), qmatmul.dequantize(qm))
    rows = np.array([39, 0, 17, 17])
    assert np.array_equal(int8_matmul.embed_rows(w, rows), qmatmul.embed_rows(qm, rows))


def test_concat_joins_rows_whatever_their_tiles() -> None:
    """q|k|v: parts of 40 and 24 rows (not whole tiles) and float16 beside float32."""
    cases = [random_case(n, 64, 5, 32, seed=n) for n in (40, 24, 16)]
    cases[1] = random_case(24, 64, 5, 32, seed=24, dtype=np.float32)
    parts = [Int8Matrix.from_qmatrix(c[3]) for c in cases]
    joined = parts[0].concat(parts[1:])
    assert joined.shape == (80, 64) and not joined.half
    want = np.concatenate([qmatmul.dequantize(c[3]) for c in cases])
    assert np.array_equal(int8_matmul.dequantize(joined), want)
    x = np.random.default_rng(6).standard_normal((2, 64)).astype(np.float32)
    separate = np.concatenate([int8_matmul.matmul(x, p) for p in parts], axis=1)
    assert np.array_equal(int8_matmul.matmul(x, joined), separate)
    with pytest.raises(ValueError, match="only matrices"):
        parts[0].concat([Int8Matrix.from_qmatrix(random_case(16, 64, 4, 32)[3])])


@pytest.mark.parametrize("kind", GGUF_TYPES)
def test_every_gguf_type_dequantizes_as_gguf_py(int8_path: str, kind: str) -> None:
    rows, cols = 20, 512
    w = np.random.default_rng(7).standard_normal((rows, cols)).astype(np.float32) * 0.05
    data = encode(w, kind, seed=8)
    t = gguf_quants.block_type(kind)
    qm = QMatrix.from_arrays(*gguf_quants.to_affine(data, kind, rows, cols), t.group_size, t.bits)
    iw = Int8Matrix.from_qmatrix(qm)
    # symmetric types store no biases: -zero * scale is each one exactly
    assert iw.zero == SYMMETRIC_ZERO.get(kind, 0) and iw.biases.size == (
        0 if iw.zero else iw.scales.size
    )
    want = gguf.quants.dequantize(data, GGMLQuantizationType[kind]).reshape(rows, cols)
    got = int8_matmul.dequantize(iw) + np.float32(0)  # gguf-py's -0.0 where q = zero point
    assert np.array_equal(got.view(np.uint32), (want.astype(np.float32) + 0).view(np.uint32))
    x = np.random.default_rng(9).standard_normal((3, cols)).astype(np.float32)
    q = iw.q()
    s, b = iw.params()
    assert_close(
        int8_matmul.matmul(x, iw), int8_ref.matmul_reference(x, q, s, b, t.group_size, t.bits)
    )


def real_model_paths() -> list[Path]:
    root = Path.home() / ".cache/branchchat/models"
    names = ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf")
    return [root / name for name in names if (root / name).is_file()]


@pytest.mark.real_model
def test_real_tensors_of_both_models_round_trip() -> None:
    """One tensor of each type in each model (the first 64 rows; heads and embeddings
    whole-row blocks like any other): gguf-py's values bit for bit, QMatrix's numbers."""
    from engine.gguf_file import read_gguf_file

    paths = real_model_paths()
    if not paths:
        pytest.skip("neither real model is present (`python -m engine fetch`)")
    seen = 0
    for path in paths:
        reader = gguf.GGUFReader(path)
        _, tensors = read_gguf_file(path)
        kinds: set[str] = set()
        for info in reader.tensors:
            kind = info.tensor_type.name
            weight = tensors[info.name]
            if kind in kinds or not isinstance(weight, QuantizedWeight):
                continue
            kinds.add(kind)
            qm = QMatrix.from_arrays(
                weight.packed[:64],
                weight.scales[:64],
                weight.biases[:64],
                weight.group_size,
                weight.bits,
            )
            got = int8_matmul.dequantize(Int8Matrix.from_qmatrix(qm))
            want = gguf.quants.dequantize(np.asarray(info.data)[:64], info.tensor_type)
            assert np.array_equal(got, qmatmul.dequantize(qm)), (path.name, info.name)
            assert np.array_equal(
                (got + 0).view(np.uint32), (want.reshape(got.shape) + 0).view(np.uint32)
            )
            seen += 1
    assert seen >= 2


def test_numpy_ops_hold_int8_matrices_when_asked() -> None:
    rng = np.random.default_rng(10)
    _, s, b, qv = random_case(32, 64, 8, 32, seed=11)
    _, s2, b2, qq = random_case(48, 64, 5, 32, seed=12)
    ops = NumpyOps(cpu_matmul="int8")
    v = ops.weight(QuantizedWeight(qv.packed, s, b, 32, 8))
    q = ops.weight(QuantizedWeight(qq.packed, s2, b2, 32, 5))
    assert isinstance(v, Int8Matrix) and ops.cpu_matmul == "int8"
    fused = ops.concat_weights([q, v])  # Gemma 3's Q5_0 q|k beside a Q8_0 v
    assert isinstance(fused, RowParts)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    want = np.concatenate([int8_matmul.matmul(x, q), int8_matmul.matmul(x, v)], axis=1)
    assert np.array_equal(ops.linear(x, fused), want)
    ids = np.array([47, 48, 79, 0])
    want_rows = np.concatenate([int8_matmul.dequantize(q), int8_matmul.dequantize(v)])[ids]
    assert np.array_equal(ops.embed(fused, ids), want_rows)
    assert isinstance(
        NumpyOps(packed=True, cpu_matmul="float").weight(QuantizedWeight(qv.packed, s, b, 32, 8)),
        QMatrix,
    )
    with pytest.raises(ValueError, match="cpu_matmul"):
        NumpyOps(cpu_matmul="int4")
    with pytest.raises(ValueError, match="packed weights"):
        NumpyOps(packed=False, cpu_matmul="int8")


def test_compact_weights_are_q8_0_under_int8_and_float32_otherwise() -> None:
    """A drafter's float matrix: Q8_0 (symmetric, zero 128) where products take int8
    activations, its product within the rounding of 8-bit weights; float32 as `weight`
    gives it under float products."""
    rng = np.random.default_rng(13)
    w = rng.standard_normal((40, 96)).astype(np.float32)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    compact = NumpyOps(cpu_matmul="int8").compact_weight(w)
    assert isinstance(compact, Int8Matrix) and (compact.bits, compact.zero) == (8, 128)
    assert np.array_equal(int8_matmul.dequantize(compact), dequantize(quantize_q8_0(w)))
    got, want = NumpyOps(cpu_matmul="int8").linear(x, compact), x @ w.T
    assert np.abs(got - want).max() <= 0.01 * np.abs(want).max()
    dense = NumpyOps(cpu_matmul="float").compact_weight(w)
    assert np.array_equal(dense, NumpyOps(cpu_matmul="float").weight(w))


def test_bad_arguments_are_refused() -> None:
    *_, qm = random_case(16, 64, 4, 32)
    w = Int8Matrix.from_qmatrix(qm)
    with pytest.raises(ValueError, match="x must be"):
        int8_matmul.matmul(np.zeros((2, 32), np.float32), w)
    with pytest.raises(ValueError, match="unknown int8 path"):
        int8_matmul.set_path("avx1024")
    with pytest.raises(ValueError, match="no int8 layout"):
        Int8Matrix.from_q(np.zeros((16, 64), np.uint8), qm.scales, qm.biases, 24, 4)
    with pytest.raises(IndexError):
        int8_matmul.embed_rows(w, np.array([16]))
