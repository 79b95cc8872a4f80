"""Matrix products on the CPU by integer dot products, llama.cpp's way: the activations
are quantized to int8 blocks of 32 (Q8_0), and each weight row's unsigned q meets them in
vpdpbusd (u8 x s8, 4 products per int32 lane), so a weight is read as its few bits and
never turned into a float. Decode reads ~0.56 bytes a weight at 4 bits (the float kernel
of kernels/qmatmul.py reads as many, but spends ~2x the instructions converting them).

`Int8Matrix` holds a `kernels.qmatmul.QMatrix` (W = s * q + b per group, any bits and
group of the GGUF types) re-laid for that instruction once at load: tiles of 16 output
rows, each k-quad of a tile one 64-byte vector (kernels/csrc/int8.h describes it).
The arithmetic is defined in `kernels.int8_ref`; the C kernel picks its code path at run
time (`info()`, `set_path`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels import qmatmul
from kernels.gguf_quants import unpack_bits
from kernels.qmatmul import QMatrix

F32 = np.float32
TILE = 16  # output rows per tile (kernels/csrc/int8.h I8_TILE)
PATHS = ("generic", "avx2", "avxvnni", "avx512vnni")


def _ext() -> Any:
    ext = qmatmul._ext
    if ext is None or not hasattr(ext, "int8_matmul"):
        raise RuntimeError("kernels._qmatmul is not built (pip install -e . builds it)")
    return ext


def available() -> bool:
    """Whether the C kernel is built with the int8 entry points."""
    return qmatmul._ext is not None and hasattr(qmatmul._ext, "int8_matmul")


def info() -> dict[str, Any]:
    """{'path': the code path in use, 'supported': those this build and CPU can run}."""
    return dict(_ext().int8_info())


def set_path(name: str) -> None:
    """Use one code path (tests, benchmarks); ValueError if this CPU cannot run it."""
    _ext().set_int8_path(name)


def has_simd() -> bool:
    """Whether a SIMD code path runs here (the portable C one is slower than BLAS)."""
    return available() and info()["path"] != "generic"


BUILD_ELEMENTS = 1 << 22  # codes per block of rows from_qmatrix re-lays at a time


def _codes(packed: np.ndarray, bits: int) -> np.ndarray:
    """MLX-packed uint32 rows -> their unsigned codes, uint8 [rows, k]."""
    raw = np.ascontiguousarray(packed).view(np.uint8)  # little-endian bit stream per row
    if bits == 8:
        return raw
    if bits == 4:
        return np.stack([raw & 15, raw >> 4], axis=-1).reshape(raw.shape[0], -1)
    return unpack_bits(packed, bits)


def _zero_point(scales: np.ndarray, biases: np.ndarray) -> int:
    """z in [1, 256) with biases == -z * scales exactly in every group, else 0."""
    s, b = scales.astype(np.float64), biases.astype(np.float64)
    nonzero = s != 0
    if not nonzero.any():
        return 0
    z = -b[nonzero].flat[0] / s[nonzero].flat[0]
    if not (z == round(z) and 1 <= z < 256):
        return 0
    product = (scales * scales.dtype.type(-z)).astype(scales.dtype)  # exact when it holds
    return int(z) if np.array_equal(product, biases) else 0


def _planes(bits: int) -> int:
    return {5: 1, 6: 2}.get(bits, 0)


@dataclass(frozen=True, eq=False)
class Int8Matrix:
    """A quantized [n, k] weight in the tiled layout: W[j] = scales * q + biases per group.

    qs: uint8 [tiles, 16 * k / 2] (bits <= 6: nibbles) or [tiles, 16 * k] (bits 8);
    hbits: uint64 [tiles, planes, k / 4], bit 4 (and 5) of q for bits 5 and 6 (planes 0
    otherwise); scales/biases: [tiles, k / group_size, 16], float16 or float32.
    zero > 0: a symmetric type's (Q8_0, Q4_0, Q5_0, Q6_K, Q3_K), whose biases are exactly
    -zero * scales: none are stored ([tiles, groups, 0]) and the kernel forms each, the
    same float, from its scale (decode reads 2 bytes a group fewer).
    """

    qs: np.ndarray
    hbits: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    n: int
    k: int
    bits: int
    group_size: int
    zero: int = 0

    @classmethod
    def from_qmatrix(cls, qm: QMatrix) -> Int8Matrix:
        """The same matrix re-laid; a block of rows at a time, so a 262144-row head needs
        no more than a few tens of MB beside itself."""
        n, k = qm.shape
        step = max(TILE, BUILD_ELEMENTS // k // TILE * TILE)
        blocks = [
            cls.from_q(
                _codes(qm.packed[start : start + step], qm.bits),
                qm.scales[start : start + step],
                qm.biases[start : start + step],
                qm.group_size,
                qm.bits,
            )
            for start in range(0, n, step)
        ]
        return blocks[0] if len(blocks) == 1 else blocks[0].concat(blocks[1:])

    @classmethod
    def from_q(
        cls, q: np.ndarray, scales: np.ndarray, biases: np.ndarray, group_size: int, bits: int
    ) -> Int8Matrix:
        """From unsigned q [n, k] and scales/biases [n, k / group_size] (float16 or 32)."""
        if not qmatmul.supports(bits, group_size):
            raise ValueError(f"no int8 layout for bits={bits}, group_size={group_size}")
        n, k = q.shape
        if k % 32 or k % group_size or scales.shape != (n, k // group_size):
            raise ValueError(f"k={k} must be a multiple of 32 and of group_size {group_size}")
        if scales.dtype != biases.dtype or scales.dtype not in (np.float16, F32):
            raise ValueError("scales and biases must both be float16 or both float32")
        tiles = -(-n // TILE)
        qp = np.zeros((tiles * TILE, k), dtype=np.uint8)
        qp[:n] = q
        qt = qp.reshape(tiles, TILE, k)
        if bits == 8:  # [t, r, p, i] -> [t, p, r, i]
            qs = qt.reshape(tiles, TILE, k // 4, 4).transpose(0, 2, 1, 3)
        else:  # nibbles: low = quad 2v, high = quad 2v + 1, as [t, v, r, i]
            lo = (qt & 15).reshape(tiles, TILE, k // 8, 2, 4)
            qs = (lo[:, :, :, 0] | (lo[:, :, :, 1] << 4)).transpose(0, 2, 1, 3)
        planes = []
        for plane in range(_planes(bits)):
            bit = ((qt >> (4 + plane)) & 1).reshape(tiles, TILE, k // 4, 4).transpose(0, 2, 1, 3)
            packed = np.packbits(bit.reshape(tiles, k // 4, 64), axis=-1, bitorder="little")
            planes.append(packed.view("<u8").reshape(tiles, k // 4))
        hbits = np.stack(planes, axis=1) if planes else np.zeros((tiles, 0, k // 4), "<u8")

        def tiled(a: np.ndarray) -> np.ndarray:  # [n, groups] -> [tiles, groups, 16]
            padded = np.zeros((tiles * TILE, a.shape[1]), dtype=a.dtype)
            padded[:n] = a
            return np.ascontiguousarray(padded.reshape(tiles, TILE, -1).transpose(0, 2, 1))

        zero = _zero_point(scales, biases)
        return cls(
            np.ascontiguousarray(qs.reshape(tiles, -1)),
            np.ascontiguousarray(hbits),
            tiled(scales),
            tiled(biases[:, :0] if zero else biases),
            n,
            k,
            bits,
            group_size,
            zero,
        )

    @property
    def half(self) -> bool:
        return self.scales.dtype == np.float16

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    @property
    def nbytes(self) -> int:
        return int(self.qs.nbytes + self.hbits.nbytes + self.scales.nbytes + self.biases.nbytes)

    def q(self) -> np.ndarray:
        """The unsigned q [n, k] back from the layout (uint8)."""
        tiles, k = self.qs.shape[0], self.k
        if self.bits == 8:
            qt = self.qs.reshape(tiles, k // 4, TILE, 4).transpose(0, 2, 1, 3)
            return np.ascontiguousarray(qt.reshape(tiles * TILE, k)[: self.n])
        byte = self.qs.reshape(tiles, k // 8, TILE, 4).transpose(0, 2, 1, 3)  # [t, r, v, i]
        q = np.stack([byte & 15, byte >> 4], axis=3).reshape(tiles, TILE, k)
        for plane in range(_planes(self.bits)):
            bits = np.unpackbits(
                self.hbits[:, plane].view(np.uint8).reshape(tiles, k // 4, 8),
                axis=-1,
                bitorder="little",
            )  # [t, p, 64] -> [t, r, p, i]
            bit = bits.reshape(tiles, k // 4, TILE, 4).transpose(0, 2, 1, 3).reshape(tiles, TILE, k)
            q |= bit << (4 + plane)
        return np.ascontiguousarray(q.reshape(tiles * TILE, k)[: self.n])

    def params(self) -> tuple[np.ndarray, np.ndarray]:
        """scales, biases as [n, k / group_size]."""

        def untiled(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a.transpose(0, 2, 1).reshape(-1, a.shape[1])[: self.n])

        scales = untiled(self.scales)
        if self.zero:
            return scales, (scales * self.scales.dtype.type(-self.zero)).astype(scales.dtype)
        return scales, untiled(self.biases)

    def can_concat(self, others: list[Int8Matrix]) -> bool:
        key = (self.bits, self.group_size, self.k)
        return all((w.bits, w.group_size, w.k) == key for w in others)

    def concat(self, others: list[Int8Matrix]) -> Int8Matrix:
        """The rows of self then of each of `others` (a fused q|k|v or gate|up)."""
        if not self.can_concat(others):
            raise ValueError("only matrices with equal bits, group size and k concat")
        parts = [self, *others]
        dtype = np.result_type(*(w.scales.dtype for w in parts))
        same = all(w.scales.dtype == dtype and w.zero == self.zero for w in parts)
        if same and all(w.n % TILE == 0 for w in parts[:-1]):
            return Int8Matrix(  # whole tiles: the arrays join as they are
                np.concatenate([w.qs for w in parts]),
                np.concatenate([w.hbits for w in parts]),
                np.concatenate([w.scales for w in parts]),
                np.concatenate([w.biases for w in parts]),
                sum(w.n for w in parts),
                self.k,
                self.bits,
                self.group_size,
                self.zero,
            )
        params = [w.params() for w in parts]
        return Int8Matrix.from_q(
            np.concatenate([w.q() for w in parts]),
            np.concatenate([s for s, _ in params]).astype(dtype),
            np.concatenate([b for _, b in params]).astype(dtype),
            self.group_size,
            self.bits,
        )


def matmul(x: np.ndarray, w: Int8Matrix, out: np.ndarray | None = None) -> np.ndarray:
    """x [..., k] @ W^T -> [..., n] float32 (any number of rows).

    out: a float32 [m, n] array to fill and return instead (a part's columns of a wider
    output, kernels/row_parts.py): written in place when its rows are contiguous.
    """
    ext = _ext()
    x2 = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])  # [m, k]
    if x2.dtype != F32 or not x2.flags.c_contiguous:
        x2 = np.ascontiguousarray(x2, dtype=F32)
    m = x2.shape[0]
    if out is not None:
        if out.shape != (m, w.n):
            raise ValueError(f"out must be [{m}, {w.n}], not {list(out.shape)}")
        if out.dtype == F32 and out.strides[1] == 4 and out.strides[0] % 4 == 0:
            ext.int8_matmul(w, x2, out)
        else:
            out[...] = matmul(x2, w)
        return out
    result = np.empty((m, w.n), dtype=F32)
    ext.int8_matmul(w, x2, result)
    return result if x.ndim == 2 else result.reshape(*x.shape[:-1], w.n)


def quantize_x(
    x: np.ndarray, group_size: int, levels: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [m, k] as the kernel quantizes it: xq int8 [levels, m, k], d [levels, m, k / 32]
    and the bias sums xb [m, k / group_size] (kernels/int8_ref.py defines them; for tests).
    levels 2: the residual's second level too, as against 8-bit weights."""
    x2 = np.ascontiguousarray(x, dtype=F32)
    m, k = x2.shape
    xq = np.empty((levels * m, k), dtype=np.int8)
    d = np.empty((levels * m, k // 32), dtype=F32)
    xb = np.empty((m, k // group_size), dtype=F32)
    _ext().int8_quantize(x2, group_size, xq, d, xb)
    return xq.reshape(levels, m, k), d.reshape(levels, m, k // 32), xb


def dequantize(w: Int8Matrix) -> np.ndarray:
    """The float32 [n, k] matrix (fma(s, q, b): QMatrix's numbers)."""
    out = np.empty(w.shape, dtype=F32)
    _ext().int8_dequantize(w, out)
    return out


def embed_rows(w: Int8Matrix, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of the dequantized matrix: [len(ids), k] float32 (an embedding lookup)."""
    rows = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    out = np.empty((rows.shape[0], w.k), dtype=F32)
    _ext().int8_dequantize(w, out, rows)
    return out
