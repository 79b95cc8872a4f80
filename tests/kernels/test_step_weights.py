"""The one-launch step's weight table (kernels/step_weights.py) without a GPU: each row
read back the way kernels/cuda/fused_step.cuh reads it (a part found by its first row,
eight weights a slice from the words the slice's bit offset names, w = fma(s, q, b))
equals the weight as the loader stored it, for every width, group size, dense dtype, row
parts and a tied head; what the table can't hold is refused by name."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from kernels import step_weights
from kernels.quantized import QuantizedWeight, dequantize
from kernels.row_parts import RowParts

FIELDS = step_weights.FIELDS


def _quantized(rows: int, cols: int, bits: int, group: int, seed: int) -> QuantizedWeight:
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**32, size=(rows, cols * bits // 32), dtype=np.uint64)
    scales = rng.standard_normal((rows, cols // group)).astype(np.float32) * 0.01
    biases = rng.standard_normal((rows, cols // group)).astype(np.float32) * 0.05
    return QuantizedWeight(
        mx.array(words.astype(np.uint32)), mx.array(scales), mx.array(biases), group, bits
    )


def _slice(words: np.ndarray, start: int, fmt: int, k: int) -> np.ndarray:
    """FqSlice::load + decode's words and bits for weights k .. k + 7 of a row at `start`."""
    row = words[start:]
    if fmt == step_weights.F32:
        return row[k : k + 8].view(np.float32)
    if fmt in (step_weights.F16, step_weights.BF16):
        raw = row[k // 2 : k // 2 + 4].view(np.uint16)
        if fmt == step_weights.F16:
            return raw.view(np.float16).astype(np.float32)
        return (raw.astype(np.uint32) << 16).view(np.float32)
    w0, sh = k * fmt // 32, (k * fmt) % 32
    nw = {2: 1, 4: 1, 8: 2}.get(fmt, (8 * fmt + 24 + 31) // 32)
    bits = 0
    for i in range(nw):
        bits |= int(row[w0 + i]) << (32 * i)
    bits >>= sh
    return np.array([(bits >> (fmt * i)) & ((1 << fmt) - 1) for i in range(8)], np.float64)


def read_row(table: step_weights.WeightTable, mat: int, row: int, cols: int) -> np.ndarray:
    meta = np.array(table.meta)
    words, scales, biases = (np.array(a) for a in (table.words, table.scales, table.biases))
    assert scales.dtype == biases.dtype == np.uint32  # bits: moved, never computed with
    part = 2 if row >= meta[mat, 2, 0] else 1 if row >= meta[mat, 1, 0] else 0
    row0, w0, g0, row_words, fmt, shift, gpr, b0 = (int(v) for v in meta[mat, part])
    assert w0 % 4 == 0  # 16-byte loads
    r = row - row0
    out = np.empty(cols, np.float32)
    for k in range(0, cols, 8):
        values = _slice(words, w0 + r * row_words, fmt & 15 if fmt >= 64 else fmt, k)
        if fmt <= 8 or fmt >= 64:
            s, b = _group(scales, biases, fmt, g0, b0, r * gpr + (k >> shift), shift)
            values = (s * values + b).astype(np.float32)  # exact product: one rounding, as fma
        out[k : k + 8] = values
    return out


def _group(scales, biases, fmt, g0, b0, g, shift) -> tuple[np.float64, np.float64]:
    """A group's s and b as FqSlice::load finds them: float32 slots, or a K-quant's uint16
    code (two a slot) and its super-block's float16 pair (one a slot), multiplied out."""
    if fmt <= 8:
        s, b = scales.view(np.float32)[g0 + g], biases.view(np.float32)[b0 + g]
        return np.float64(s), np.float64(b)
    code = int(scales.view(np.uint16)[2 * g0 + g])
    pair = biases.view(np.float16)[2 * (b0 + (g >> (8 - shift))) :][:2].astype(np.float32)
    if fmt < 128:  # s = d sc, b = -(dmin m)
        s = pair[0] * np.float32(code & 0xFF)
        b = -(pair[1] * np.float32(code >> 8))
    else:  # s = d sc (sc + 128 stored), b = -2^(bits - 1) s
        s = pair[0] * np.float32(code - 128)
        b = np.float32(-(1 << ((fmt & 15) - 1))) * s
    return np.float64(s), np.float64(b)


def _dense(w) -> np.ndarray:
    if isinstance(w, QuantizedWeight):
        return dequantize(w)
    return np.array(w.astype(mx.float32))


@pytest.mark.parametrize("bits", step_weights.AFFINE_BITS)
@pytest.mark.parametrize("group", step_weights.GROUP_SIZES)
def test_every_width_and_group_reads_back_as_stored(bits, group):
    w = _quantized(6, 256, bits, group, seed=bits * 1000 + group)
    table = step_weights.build([w], single_part_from=1)
    assert table.formats == (bits,)
    want = _dense(w)
    for row in range(6):
        np.testing.assert_array_equal(read_row(table, 0, row, 256), want[row])


DENSE = [
    (mx.float16, step_weights.F16),
    (mx.bfloat16, step_weights.BF16),
    (mx.float32, step_weights.F32),
]


@pytest.mark.parametrize("dtype,fmt", DENSE)
def test_dense_weights_keep_their_dtype(dtype, fmt):
    w = mx.array(np.random.default_rng(3).standard_normal((5, 64)).astype(np.float32)).astype(dtype)
    table = step_weights.build([w], single_part_from=1)
    assert table.formats == (fmt,)
    for row in range(5):
        np.testing.assert_array_equal(read_row(table, 0, row, 64), _dense(w)[row])


def test_row_parts_ties_and_layer_order():
    """A q|k|v of three formats, a tied head and table, and layers laid out in order."""
    q, k, v = _quantized(8, 64, 4, 32, 1), _quantized(4, 64, 6, 16, 2), _quantized(4, 64, 8, 32, 3)
    qkv = RowParts((q, k, v), (8, 4, 4), 64)
    shapes = [(64, 64, 4), (32, 64, 5), (64, 32, 6)]
    o, gu, down = (_quantized(n, c, 4, 32, s) for n, c, s in shapes)
    embed = _quantized(10, 64, 8, 32, 7)
    layer = (_quantized(n, c, 4, 32, s) for n, c, s in shapes)
    again = [RowParts((q, k, v), (8, 4, 4), 64), *layer]
    matrices = [qkv, o, gu, down, *again, embed, embed]
    table = step_weights.build(matrices, single_part_from=8)
    assert table.formats == (4, 6, 8)
    assert table.roles == ((4, 6, 8), (4,), (4,), (4,), (8,))  # qkv, o, gate_up, down, head
    want = np.concatenate([_dense(q), _dense(k), _dense(v)])
    for row in range(16):
        np.testing.assert_array_equal(read_row(table, 0, row, 64), want[row])
        np.testing.assert_array_equal(read_row(table, 4, row, 64), want[row])
    for row in range(10):
        np.testing.assert_array_equal(read_row(table, 9, row, 64), _dense(embed)[row])
    meta = np.array(table.meta)
    np.testing.assert_array_equal(meta[8], meta[9])  # tied: one copy of the words
    firsts = [int(meta[m, 0, 1]) for m in range(9)]
    assert firsts == sorted(firsts)  # a layer's prefetch range ends at the next one
    # a layer's bytes: its parts' words and float32 scales and biases, and the gaps that
    # start each part on 16 bytes
    parts = [q, k, v, *(_quantized(n, c, 4, 32, s) for n, c, s in shapes)]
    stored = sum(int(p.packed.nbytes) + 8 * int(p.scales.size) for p in parts)
    assert stored <= table.layer_bytes <= stored + 12 * len(parts)


def test_what_the_table_cannot_hold_is_named():
    with pytest.raises(ValueError, match="7-bit"):
        step_weights.build([_quantized(2, 64, 4, 32, 0).__class__(
            mx.zeros((2, 14), dtype=mx.uint32), mx.zeros((2, 2)), mx.zeros((2, 2)), 32, 7
        )], 1)  # fmt: skip
    with pytest.raises(ValueError, match="dtype"):
        step_weights.build([mx.zeros((4, 8), dtype=mx.int32)], 1)
    two = RowParts((_quantized(2, 64, 4, 32, 0), _quantized(2, 64, 8, 32, 1)), (2, 2), 64)
    with pytest.raises(ValueError, match="one part"):
        step_weights.build([two], single_part_from=0)


def test_the_table_reads_what_the_loader_stored_not_the_compute_copy():
    """On CUDA the MLX backend keeps each weight as loaded beside its bfloat16-scaled or
    dense copy until the step's table is built: a q|k|v of Q4 and a groups-of-16 Q6_K part
    reads back with its float32 scales and 6-bit words."""
    from kernels.ops_mlx import MlxOps

    ops = MlxOps(dtype="bfloat16")
    ops._stored = {}  # as on CUDA
    q, v = _quantized(8, 64, 4, 32, 11), _quantized(4, 64, 6, 16, 12)
    qkv = ops.concat_weights([ops.weight(q), ops.weight(v)])
    assert isinstance(qkv, RowParts) and qkv.parts[1].dtype == mx.bfloat16  # v went dense
    stored = ops.stored(qkv)
    assert stored.parts == (q, v)
    table = step_weights.build([stored], single_part_from=1)
    assert table.formats == (4, 6)
    want = np.concatenate([_dense(q), _dense(v)])
    for row in range(12):
        np.testing.assert_array_equal(read_row(table, 0, row, 64), want[row])
    ops.forget_stored()
    assert ops.stored(qkv) is qkv


def test_the_kernels_float_of_a_code_is_the_code():
    """fused_step.cuh turns a code q into a float as the float of bits 0x4B000000 | q
    minus 2^23 (no integer conversion): exact for every code of every width it reads."""
    q = np.arange(256, dtype=np.uint32)
    as_float = (np.uint32(0x4B000000) | q).view(np.float32) - np.float32(8388608.0)
    np.testing.assert_array_equal(as_float, q.astype(np.float32))
    source = (Path(__file__).parents[2] / "kernels" / "cuda" / "fused_step.cuh").read_text()
    assert "__uint_as_float(0x4B000000u | q)" in source


def test_wide_loads_take_4_bit_groups_of_32_or_more():
    """FQ_WIDE reads 32 weights of a 4- or 8-bit row with one scale and bias: a table with
    a 4- or 8-bit part of groups of 16 is refused by name; one whose 16s are 6-bit passes."""
    q4_32, q6_16 = _quantized(8, 64, 4, 32, 1), _quantized(4, 64, 6, 16, 2)
    step_weights.check_wide(
        step_weights.build([RowParts((q4_32, q6_16), (8, 4), 64)], single_part_from=1)
    )
    q4_16 = _quantized(4, 64, 4, 16, 3)
    table = step_weights.build([q4_32, RowParts((q6_16, q4_16), (4, 4), 64)], single_part_from=2)
    with pytest.raises(ValueError, match="matrix 1 has 4-bit groups of 16"):
        step_weights.check_wide(table)
    q8_16 = _quantized(4, 64, 8, 16, 4)
    with pytest.raises(ValueError, match="matrix 0 has 8-bit groups of 16"):
        step_weights.check_wide(step_weights.build([q8_16, q4_32], single_part_from=1))
