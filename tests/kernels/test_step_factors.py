"""K-quant parts as their super-blocks' factors (kernels/step_factors.py, FQ_KFACTORS): on
the Q4_K_M and Q6_K files llama.cpp's quantizer wrote for the oracle fixtures, every
K-quant part factors exactly, and its rows read back from the table the way
kernels/cuda/fused_step.cuh multiplies the factors out equal the weights as the loader
stored them, bit for bit, in fewer bytes; what does not factor stays float32."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from engine.gguf_file import read_gguf_file
from kernels import step_factors, step_weights
from kernels.quantized import QuantizedWeight, dequantize
from kernels.row_parts import RowParts
from tests.kernels.test_step_weights import _quantized, read_row

FIXTURES = Path(__file__).resolve().parents[1] / "oracles" / "fixtures"
KINDS = {"Q4_K": 64 + 4, "Q5_K": 64 + 5, "Q6_K": 128 + 6}


def _k_quants(name: str) -> list[QuantizedWeight]:
    _, tensors = read_gguf_file(FIXTURES / name)
    return [w for w in tensors.values() if isinstance(w, QuantizedWeight) and w.source in KINDS]


@pytest.mark.parametrize(
    "name", ["llama/Q4_K_M.gguf", "qwen3/Q6_K.gguf", "gemma3_gguf/Q4_K_M.gguf"]
)
def test_every_k_quant_part_factors_and_reads_back_as_stored(name):
    weights = _k_quants(name)
    assert {w.source for w in weights} >= ({"Q6_K"} if "Q6_K" in name else {"Q4_K", "Q6_K"})
    for w in weights:
        plain = step_weights.build([w], single_part_from=1)
        table = step_weights.build([w], single_part_from=1, k_factors=True)
        assert table.formats == (KINDS[w.source],)
        rows, cols = w.shape
        want = dequantize(w)
        for row in {0, 1, rows // 2, rows - 1}:
            np.testing.assert_array_equal(read_row(table, 0, row, cols), want[row])
        # 8 bytes a group become 2, and 4 a super-block of 256 // group_size groups
        groups, supers = int(w.scales.size), int(w.scales.size) * w.group_size // 256
        assert plain.scales.nbytes + plain.biases.nbytes == 8 * groups + 8  # + 1 pad each
        assert table.scales.nbytes + table.biases.nbytes <= 2 * groups + 4 * supers + 12


def test_parts_of_either_layout_share_a_table():
    """A q|k|v of Q4_K, plain 4-bit groups (no factors) and Q6_K, then a Q4_K layer: each
    part's slots of scales and biases found from its own meta."""
    _, tensors = read_gguf_file(FIXTURES / "llama" / "Q4_K_M.gguf")
    q4, q6 = tensors["blk.0.attn_k.weight"], tensors["blk.0.attn_v.weight"]
    assert (q4.source, q6.source) == ("Q4_K", "Q6_K")
    cols = q4.shape[1]
    other = _quantized(24, cols, 4, 32, seed=5)
    parts = [q4, other, q6]
    qkv = RowParts(tuple(parts), tuple(p.shape[0] for p in parts), cols)
    table = step_weights.build([qkv, q4, q4, q4, q4], single_part_from=4, k_factors=True)
    assert table.formats == (4, 68, 134)
    want = np.concatenate([dequantize(p) for p in parts])
    for row in range(0, want.shape[0], 7):
        np.testing.assert_array_equal(read_row(table, 0, row, cols), want[row])
    np.testing.assert_array_equal(read_row(table, 1, 3, cols), dequantize(q4)[3])


def test_scales_without_exact_factors_stay_float32():
    """A Q4_K part whose scales are no float16 times small integers (another quantizer's,
    or damaged): no factors, so the table keeps its float32 s and b."""
    w = next(w for w in _k_quants("llama/Q4_K_M.gguf") if w.source == "Q4_K")
    s = np.array(w.scales.astype(mx.float32))
    s[0, 0] = np.float32(np.pi)  # no float16 d times a code of 8 bits gives pi
    odd = QuantizedWeight(w.packed, mx.array(s), w.biases, w.group_size, w.bits, source="Q4_K")
    assert step_factors.factors("Q4_K", 4, s, np.array(w.biases.astype(mx.float32))) is None
    table = step_weights.build([odd], single_part_from=1, k_factors=True)
    assert table.formats == (4,)
    np.testing.assert_array_equal(read_row(table, 0, 0, w.shape[1]), dequantize(odd)[0])
    assert step_factors.factors("Q4_0", 4, s, s) is None  # not a K-quant


def _multiply_out(fmt: int, codes: np.ndarray, supers: np.ndarray) -> tuple[np.ndarray, ...]:
    per = codes.shape[1] // supers.shape[1]
    d = np.repeat(supers[..., 0].astype(np.float32), per, axis=1)
    e = np.repeat(supers[..., 1].astype(np.float32), per, axis=1)
    if fmt >= 128:
        s = d * (codes.astype(np.float32) - np.float32(128))
        return s, np.float32(-(1 << ((fmt & 15) - 1))) * s
    return d * (codes & 0xFF).astype(np.float32), -(e * (codes >> 8).astype(np.float32))


def _same(found, s: np.ndarray, b: np.ndarray) -> None:
    """The factors multiplied out give s and b bit for bit (zeros' signs included)."""
    got_s, got_b = _multiply_out(*found)
    np.testing.assert_array_equal(got_s.view(np.uint32), s.view(np.uint32))
    np.testing.assert_array_equal(got_b.view(np.uint32), b.view(np.uint32))


def test_a_zero_super_block_keeps_the_signs_of_its_zeros():
    """d = 0 in a Q6_K super-block makes s = 0 * sc: +0 or -0 by the code's sign, and
    b = -32 s the other; Q4_K's dmin = 0 makes every b -0. The factors give them back."""
    rng = np.random.default_rng(2)
    sc = rng.integers(-128, 128, size=(2, 32)).astype(np.float32)  # two rows, 2 supers each
    d = np.repeat(rng.random((2, 2)).astype(np.float16).astype(np.float32), 16, axis=1)
    d[0, :16] = 0.0
    s6 = (d * sc).astype(np.float32)
    assert np.signbit(s6[0, :16]).any() and not np.signbit(s6[0, :16]).all()
    _same(step_factors.factors("Q6_K", 6, s6, np.float32(-32) * s6), s6, np.float32(-32) * s6)
    m = rng.integers(0, 64, size=(1, 16)).astype(np.float32)
    s4 = np.repeat(np.float32(0.5), 16)[None] * rng.integers(0, 64, size=(1, 16))
    b4 = -(np.float32(0.0) * m)  # all -0
    s4 = s4.astype(np.float32)
    _same(step_factors.factors("Q4_K", 4, s4, b4), s4, b4)
