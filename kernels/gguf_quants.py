"""GGUF's block quantizations rewritten, exactly, as the affine form w = s * q + b.

Every block type llama.cpp writes for weights people download (ggml-quants.c; the
layouts below follow gguf-py's `gguf.quants`, the reference the tests compare with)
stores per run of 16 or 32 elements an integer code and one or two factors. Each run
becomes a group of the affine form: q an unsigned integer of `bits` bits, s and b one
float32 per group, packed as MLX packs them (element i of a row at bits [i * bits,
(i + 1) * bits) of the row's little-endian bit stream). The conversion is exact:

    Q4_0  d * (q - 8)              s = d,        b = -8 d          4 bits, group 32
    Q4_1  d * q + m                s = d,        b = m             4 bits, group 32
    Q5_0  d * (q - 16)             s = d,        b = -16 d         5 bits, group 32
    Q5_1  d * q + m                s = d,        b = m             5 bits, group 32
    Q8_0  d * q8 (int8)            s = d,        b = -128 d        8 bits, group 32
    Q8_K  d * q8 (int8), d float32 s = d,        b = -128 d        8 bits, group 32
    Q4_K  d sc * q - dmin m        s = d sc,     b = -dmin m       4 bits, group 32
    Q5_K  d sc * q - dmin m        s = d sc,     b = -dmin m       5 bits, group 32
    Q6_K  d sc * (q - 32)          s = d sc,     b = -32 d sc      6 bits, group 16
    Q3_K  d (sc - 32) * (q - 4)    s = d (sc-32), b = -4 s         3 bits, group 16
    Q2_K  d sc * q - dmin m        s = d sc,     b = -dmin m       2 bits, group 16

s and b are exact in float32 (a float16 times a small integer), so fma(s, q, b) rounds
once where gguf-py rounds once, and gives its float32 bit for bit. Where s * q is also
exact in float32 (all but Q8_K), an unfused s * q + b does too (MLX's dequantize).
The IQ* types (lattice codebooks, not affine) and any other type are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

F16 = np.float16
F32 = np.float32
QK_K = 256  # elements in a K-quant super-block
ROW_CHUNK_ELEMENTS = 1 << 22  # convert this many elements at a time: bounded scratch


@dataclass(frozen=True)
class BlockType:
    """One GGUF block type and the affine form it converts to."""

    name: str
    block_elements: int
    block_bytes: int
    bits: int
    group_size: int
    fma_only: bool = False  # s * q is not exact in float32: w needs one rounding of s*q+b


BLOCK_TYPES = {
    t.name: t
    for t in (
        BlockType("Q4_0", 32, 18, 4, 32),
        BlockType("Q4_1", 32, 20, 4, 32),
        BlockType("Q5_0", 32, 22, 5, 32),
        BlockType("Q5_1", 32, 24, 5, 32),
        BlockType("Q8_0", 32, 34, 8, 32),
        BlockType("Q2_K", QK_K, 84, 2, 16),
        BlockType("Q3_K", QK_K, 110, 3, 16),
        BlockType("Q4_K", QK_K, 144, 4, 32),
        BlockType("Q5_K", QK_K, 176, 5, 32),
        BlockType("Q6_K", QK_K, 210, 6, 16),
        BlockType("Q8_K", QK_K, 292, 8, 32, fma_only=True),
    )
}
DENSE_TYPES = ("F32", "F16", "BF16")
SUPPORTED_TYPES = (*DENSE_TYPES, *BLOCK_TYPES)


def block_type(name: str) -> BlockType:
    """The block type called `name`; ValueError naming it (and what is supported) if none."""
    if name in DENSE_TYPES:
        raise ValueError(f"{name} is a dense type, not a block quantization")
    if name not in BLOCK_TYPES:
        raise ValueError(f"{name} is not supported; supported: {', '.join(SUPPORTED_TYPES)}")
    return BLOCK_TYPES[name]


# -- one block type each: blocks [nb, block_bytes] uint8 -> q [nb, E] uint8, s, b [nb, G] --


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of each block, as float32 [nb, 1]."""
    return blocks[:, start : start + 2].copy().view(F16).astype(F32)


def _nibbles(qs: np.ndarray, run: int) -> np.ndarray:
    """Runs of `run` bytes -> 2 * run elements: the low nibbles, then the high ones."""
    nb = qs.shape[0]
    q = qs.reshape(nb, -1, 1, run) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(15)).reshape(nb, -1)


def _bits_of(qh: np.ndarray, run: int, width: int) -> np.ndarray:
    """Runs of `run` bytes -> (8 / width) * run fields of `width` bits, low fields first."""
    nb = qh.shape[0]
    shifts = np.arange(0, 8, width, dtype=np.uint8).reshape(1, 1, -1, 1)
    q = qh.reshape(nb, -1, 1, run) >> shifts
    return (q & np.uint8((1 << width) - 1)).reshape(nb, -1)


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    d = _half(blocks, 0)
    return _nibbles(blocks[:, 2:], 16), d, -8 * d


def _q4_1(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    return _nibbles(blocks[:, 4:], 16), _half(blocks, 0), _half(blocks, 2)


def _q5_high(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 32 fifth bits, element i at bit i of a little-endian uint32."""
    return np.unpackbits(qh, axis=-1, bitorder="little") << np.uint8(4)


def _q5_0(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    d = _half(blocks, 0)
    return _nibbles(blocks[:, 6:], 16) | _q5_high(blocks[:, 2:6]), d, -16 * d


def _q5_1(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    q = _nibbles(blocks[:, 8:], 16) | _q5_high(blocks[:, 4:8])
    return q, _half(blocks, 0), _half(blocks, 2)


def _q8_0(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    d = _half(blocks, 0)
    return blocks[:, 2:] ^ np.uint8(0x80), d, -128 * d


def _q8_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    d = blocks[:, :4].copy().view(F32)
    s = np.repeat(d, QK_K // 32, axis=1)  # one group of 32 per run: MLX's group sizes
    return blocks[:, 4 : 4 + QK_K] ^ np.uint8(0x80), s, -128 * s


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (get_scale_min_k4)."""
    nb = scales.shape[0]
    d, m, m_d = np.split(scales.reshape(nb, 3, 4), 3, axis=1)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.reshape(nb, 8).astype(F32), mn.reshape(nb, 8).astype(F32)


def _q4_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    sc, mn = _k_scales(blocks[:, 4:16])
    return _nibbles(blocks[:, 16:], 32), _half(blocks, 0) * sc, -(_half(blocks, 2) * mn)


def _q5_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    sc, mn = _k_scales(blocks[:, 4:16])
    q = _nibbles(blocks[:, 48:], 32) | (_bits_of(blocks[:, 16:48], 32, 1) << np.uint8(4))
    return q, _half(blocks, 0) * sc, -(_half(blocks, 2) * mn)


def _q6_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    ql = _nibbles(blocks[:, :128], 64)  # [nb, 256]
    qh = _bits_of(blocks[:, 128:192], 32, 2)  # [nb, 256]
    s = _half(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(F32)
    return ql | (qh << np.uint8(4)), s, -32 * s


def _q3_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    nb = blocks.shape[0]
    high = _bits_of(blocks[:, :32], 32, 1)  # the set bit means "no -4 offset"
    low = _bits_of(blocks[:, 32:96], 32, 2)
    raw = blocks[:, 96:108]
    lo = raw[:, :8].reshape(nb, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
    hi = raw[:, 8:].reshape(nb, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)
    sc = (lo.reshape(nb, 16) & 0x0F) | ((hi.reshape(nb, 16) & 0x03) << 4)
    s = _half(blocks, 108) * (sc.astype(np.int8) - np.int8(32)).astype(F32)
    return low | (high << np.uint8(2)), s, -4 * s


def _q2_k(blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    sc = blocks[:, :16]
    q = _bits_of(blocks[:, 16:80], 32, 2)
    s = _half(blocks, 80) * (sc & 0x0F).astype(F32)
    return q, s, -(_half(blocks, 82) * (sc >> 4).astype(F32))


_CONVERTERS = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q8_K": _q8_k,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}


# -- packing -----------------------------------------------------------------------------


def pack_bits(q: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [rows, k] (k a multiple of 32) -> uint32 [rows, k * bits / 32], MLX's
    layout: element i at bits [i * bits, (i + 1) * bits) of the row's bit stream."""
    rows, k = q.shape
    if bits in (2, 4, 8):  # whole elements per byte
        per_byte = 8 // bits
        parts = q.reshape(rows, k // per_byte, per_byte)
        packed = parts[..., 0].copy()  # [rows, k * bits / 8]
        for i in range(1, per_byte):
            packed |= parts[..., i] << np.uint8(i * bits)
    else:  # 8 elements fill `bits` whole bytes of a uint64
        parts = q.reshape(rows, k // 8, 8)
        words = parts[..., 0].astype(np.uint64)
        for i in range(1, 8):
            words |= parts[..., i].astype(np.uint64) << np.uint64(i * bits)
        packed = words.view(np.uint8).reshape(rows, k // 8, 8)[:, :, :bits]
    return np.ascontiguousarray(packed).reshape(rows, -1).view(np.uint32)


def unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """pack_bits' inverse: uint32 [rows, words] -> uint8 codes [rows, words * 32 / bits]."""
    rows = packed.shape[0]
    stream = np.ascontiguousarray(packed).view(np.uint8).reshape(rows, -1, bits)  # 8 elements
    wide = np.zeros((*stream.shape[:2], 8), dtype=np.uint8)
    wide[:, :, :bits] = stream
    words = wide.view(np.uint64)  # [rows, k / 8, 1]
    shifts = (np.arange(8, dtype=np.uint64) * bits).reshape(1, 1, 8)
    q = (words >> shifts) & np.uint64((1 << bits) - 1)
    return q.astype(np.uint8).reshape(rows, -1)


def _narrow(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both float16 when that holds them exactly (2 bytes a group fewer), else float32."""
    a16, b16 = a.astype(F16), b.astype(F16)
    if np.array_equal(a16.astype(F32), a) and np.array_equal(b16.astype(F32), b):
        return a16, b16
    return a, b


def to_affine(
    data: np.ndarray, type_name: str, rows: int, cols: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A [rows, cols] tensor's GGUF blocks (any uint8 view of its bytes) -> (packed uint32
    [rows, cols * bits / 32], scales, biases [rows, cols / group_size]); scales and biases
    float16 when that is exact, else float32. A few rows at a time: the scratch stays small."""
    kind = block_type(type_name)
    if cols % kind.block_elements:
        raise ValueError(f"a {type_name} row of {cols} elements is not whole blocks")
    blocks = np.asarray(data, dtype=np.uint8).reshape(rows, -1)
    per_row = cols // kind.block_elements
    if blocks.shape[1] != per_row * kind.block_bytes:
        raise ValueError(f"{type_name} data of {blocks.size} bytes for [{rows}, {cols}]")
    convert = _CONVERTERS[type_name]
    groups = cols // kind.group_size
    packed = np.empty((rows, cols * kind.bits // 32), dtype=np.uint32)
    scales = np.empty((rows, groups), dtype=F32)
    biases = np.empty((rows, groups), dtype=F32)
    step = max(1, ROW_CHUNK_ELEMENTS // cols)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        q, s, b = convert(blocks[r0:r1].reshape(-1, kind.block_bytes))
        packed[r0:r1] = pack_bits(q.reshape(r1 - r0, cols), kind.bits)
        scales[r0:r1] = s.reshape(r1 - r0, groups)
        biases[r0:r1] = b.reshape(r1 - r0, groups)
    return (packed, *_narrow(scales, biases))


def dequantize_affine(
    packed: np.ndarray, scales: np.ndarray, biases: np.ndarray, group_size: int, bits: int
) -> np.ndarray:
    """The reference: float32 [rows, k] with w = s * q + b rounded once (in float64 the
    product and sum are exact for every type above, then one rounding to float32)."""
    rows = packed.shape[0]
    k = packed.shape[1] * 32 // bits
    out = np.empty((rows, k), dtype=F32)
    step = max(1, ROW_CHUNK_ELEMENTS // k)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        q = unpack_bits(packed[r0:r1], bits).reshape(r1 - r0, k // group_size, group_size)
        s = scales[r0:r1].astype(np.float64)[:, :, None]
        b = biases[r0:r1].astype(np.float64)[:, :, None]
        out[r0:r1] = (q.astype(np.float64) * s + b).reshape(r1 - r0, k)
    return out
