"""GGUF block types made affine (kernels.gguf_quants) decode to gguf-py's float32 values
bit for bit: through the NumPy reference, the C kernel (every code path it has) and
MLX's dequantize where MLX represents the type.

"Bit for bit" up to the sign of zero: gguf-py computes d * (q - 8) and gets -0.0 for a
negative d, where s * q + b = 0 is +0.0 in IEEE arithmetic; `same_bits` adds +0.0 to both
sides (it turns -0.0 into +0.0 and changes no other value).
"""

from __future__ import annotations

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from kernels import gguf_quants, qmatmul
from kernels.qmatmul import QMatrix
from kernels.quantized import QuantizedWeight, quantize_q8_0
from tests.kquant_blocks import random_k_blocks

ROWS, COLS = 6, 512
GGUF_QUANTIZES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf-py has a quantizer
RANDOM_BLOCKS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")  # it only dequantizes these


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    got, want = np.asarray(got, np.float32) + np.float32(0), want.astype(np.float32) + 0
    return got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def stored_blocks(kind: str, seed: int) -> np.ndarray:
    """A [ROWS, COLS] tensor's bytes in `kind`, with varied magnitudes per row."""
    if kind in GGUF_QUANTIZES:
        rng = np.random.default_rng(seed)
        w = rng.standard_normal((ROWS, COLS)) * np.logspace(-3, 1, ROWS)[:, None]
        return gguf.quants.quantize(w.astype(np.float32), GGMLQuantizationType[kind])
    return random_k_blocks((ROWS, COLS), kind, seed)


def gguf_dequantized(kind: str, data: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(data, GGMLQuantizationType[kind]).reshape(ROWS, COLS)


@pytest.mark.parametrize("kind", GGUF_QUANTIZES + RANDOM_BLOCKS)
@pytest.mark.parametrize("seed", [0, 1])
def test_reference_dequantization_is_gguf_bit_for_bit(kind: str, seed: int) -> None:
    data = stored_blocks(kind, seed)
    packed, scales, biases = gguf_quants.to_affine(data, kind, ROWS, COLS)
    t = gguf_quants.block_type(kind)
    assert packed.shape == (ROWS, COLS * t.bits // 32)
    assert scales.shape == biases.shape == (ROWS, COLS // t.group_size)
    got = gguf_quants.dequantize_affine(packed, scales, biases, t.group_size, t.bits)
    assert same_bits(got, gguf_dequantized(kind, data))


@pytest.mark.parametrize("kind", GGUF_QUANTIZES + RANDOM_BLOCKS)
def test_kernel_dequantization_is_gguf_bit_for_bit(code_path: str, kind: str) -> None:
    data = stored_blocks(kind, 2)
    t = gguf_quants.block_type(kind)
    qm = QMatrix.from_arrays(*gguf_quants.to_affine(data, kind, ROWS, COLS), t.group_size, t.bits)
    want = gguf_dequantized(kind, data)
    assert same_bits(qmatmul.dequantize(qm), want)
    rows = np.array([5, 0, 3])
    assert same_bits(qmatmul.embed_rows(qm, rows), want[rows])


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K"])
def test_mlx_dequantization_is_gguf_bit_for_bit(kind: str) -> None:
    """The group-32 types stay MLX quantized weights; MLX's unfused s * q + b is exact
    because s * q is exact in float32 for each of them."""
    data = stored_blocks(kind, 3)
    t = gguf_quants.block_type(kind)
    packed, scales, biases = (mx.array(a) for a in gguf_quants.to_affine(data, kind, ROWS, COLS))
    assert QuantizedWeight(packed, scales, biases, t.group_size, t.bits).is_mlx_exact
    got = mx.dequantize(
        packed,
        scales.astype(mx.float32),
        biases.astype(mx.float32),
        group_size=t.group_size,
        bits=t.bits,
    )
    assert same_bits(np.array(got), gguf_dequantized(kind, data))


@pytest.mark.parametrize("kind", ["Q2_K", "Q3_K", "Q6_K", "Q8_K"])
def test_types_mlx_cannot_represent_say_so(kind: str) -> None:
    t = gguf_quants.block_type(kind)
    w = QuantizedWeight(None, None, None, t.group_size, t.bits, t.name, t.fma_only)
    assert not w.is_mlx_exact


def test_q8_k_is_d_times_the_int8_codes() -> None:
    """gguf-py has no Q8_K dequantizer: its definition is float32 d * int8 q, rounded once."""
    rng = np.random.default_rng(4)
    blocks = rng.integers(0, 256, (ROWS * COLS // 256, 292), dtype=np.uint8)
    d = (rng.standard_normal((blocks.shape[0], 1)) * 1e-3).astype(np.float32)
    blocks[:, :4] = d.view(np.uint8)
    want = (d.astype(np.float64) * blocks[:, 4:260].view(np.int8)).astype(np.float32)
    p, s, b = gguf_quants.to_affine(blocks, "Q8_K", ROWS, COLS)
    got = gguf_quants.dequantize_affine(p, s, b, 32, 8)
    assert same_bits(got, want.reshape(ROWS, COLS))
    if qmatmul.available():
        assert same_bits(
            qmatmul.dequantize(QMatrix.from_arrays(p, s, b, 32, 8)), want.reshape(ROWS, COLS)
        )


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_packing_is_mlx_layout(bits: int) -> None:
    """pack_bits writes what MLX unpacks (scale 1, bias 0 give the codes back)."""
    q = np.random.default_rng(bits).integers(0, 1 << bits, (3, 64), dtype=np.uint8)
    packed = gguf_quants.pack_bits(q, bits)
    assert packed.dtype == np.uint32 and packed.shape == (3, 64 * bits // 32)
    ones, zeros = mx.ones((3, 2)), mx.zeros((3, 2))
    got = mx.dequantize(mx.array(packed), ones, zeros, group_size=32, bits=bits)
    assert np.array_equal(np.array(got), q.astype(np.float32))
    assert np.array_equal(gguf_quants.unpack_bits(packed, bits), q)


def test_exact_factors_are_held_in_float16() -> None:
    """Q4_1's d and m are float16 in the file: kept so (what mx.load gave); Q4_K's d * sc
    is not a float16 in general: float32."""
    q41 = gguf_quants.to_affine(stored_blocks("Q4_1", 5), "Q4_1", ROWS, COLS)
    q4k = gguf_quants.to_affine(stored_blocks("Q4_K", 5), "Q4_K", ROWS, COLS)
    assert q41[1].dtype == q41[2].dtype == np.float16
    assert q4k[1].dtype == q4k[2].dtype == np.float32


@pytest.mark.parametrize("kind", ["IQ4_XS", "IQ2_XXS", "TQ1_0", "MXFP4"])
def test_other_types_are_refused_by_name(kind: str) -> None:
    with pytest.raises(ValueError, match=kind) as err:
        gguf_quants.block_type(kind)
    assert "supported: F32, F16, BF16, Q4_0" in str(err.value)


def test_dense_types_are_not_block_types() -> None:
    with pytest.raises(ValueError, match="F16 is a dense type"):
        gguf_quants.block_type("F16")


def test_partial_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="not whole blocks"):
        gguf_quants.to_affine(np.zeros((2, 144), np.uint8), "Q4_K", 2, 128)
    with pytest.raises(ValueError, match="bytes"):
        gguf_quants.to_affine(np.zeros((2, 140), np.uint8), "Q4_K", 2, 256)


def test_q8_0_quantizer_is_gguf_py_bit_for_bit() -> None:
    """`quantize_q8_0` (the drafter's compact CPU weights) writes what gguf-py's Q8_0
    quantizer writes, read through `to_affine`: the same codes, scales and biases, with
    an all-zero group and codes exactly half-way (rounded away from zero) among them."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((ROWS, COLS)) * np.logspace(-3, 1, ROWS)[:, None]).astype(np.float32)
    w[0, :32] = 0
    w[1, :32] = (np.arange(32) - 14.5) / 8  # with 15.875 in the group, d = 1/8 exactly:
    w[1, 31] = 15.875  # the others are m + 1/2 codes, rounded away from zero
    got = quantize_q8_0(w)
    packed, scales, biases = gguf_quants.to_affine(
        gguf.quants.quantize(w, GGMLQuantizationType.Q8_0), "Q8_0", ROWS, COLS
    )
    assert np.array_equal(np.asarray(got.packed), packed)
    assert same_bits(got.scales, scales) and same_bits(got.biases, biases)
    assert (got.group_size, got.bits) == (32, 8)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(np.ones((2, 48), dtype=np.float32))
