"""An affine-quantized weight in MLX's layout, as the loaders hand it to `Ops.weight`.

Its own module because the op set (kernels/ops.py) and both backends that take it
(kernels/ops_numpy.py, kernels/ops_mlx.py) import it, and the op set imports the backends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class QuantizedWeight:
    """An affine-quantized matrix in MLX's layout: w = scales * q + biases per group."""

    packed: Any  # uint32 [out, in * bits / 32]
    scales: Any  # [out, in / group_size]
    biases: Any  # [out, in / group_size]
    group_size: int
    bits: int
    source: str = ""  # the GGUF block type it was converted from ("Q4_K"), for messages
    # s * q is not exact in float32, so w needs s * q + b rounded once (fma): an unfused
    # dequantization (MLX's) would round twice (GGUF's Q8_K, whose d is float32)
    fma_only: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.packed.shape[0]), int(self.packed.shape[1]) * 32 // self.bits)

    @property
    def nbytes(self) -> int:
        return int(self.packed.nbytes + self.scales.nbytes + self.biases.nbytes)

    @property
    def is_mlx_exact(self) -> bool:
        """Whether mx.quantized_matmul / mx.dequantize take it and give its exact values:
        MLX's widths and group sizes, and s * q exact in float32 (MLX does not fuse)."""
        return (
            self.bits in (2, 3, 4, 5, 6, 8)
            and self.group_size in (32, 64, 128)
            and not (self.fma_only)
        )


def quantize_q8_0(w: np.ndarray) -> QuantizedWeight:
    """A float [out, in] matrix (in a multiple of 32) quantized as llama.cpp's Q8_0: per
    group of 32, d = max |w| / 127, q = w / d rounded half away from zero, d stored as
    float16; in MLX's layout s = d, b = -128 d over unsigned q + 128 (what
    `kernels.gguf_quants` makes of gguf-py's Q8_0 bytes, equal bit for bit). Each weight
    moves by about d / 2, ~0.4% of its group's largest."""
    w = np.asarray(w, dtype=np.float32)
    out, k = w.shape
    if k % 32:
        raise ValueError(f"Q8_0 needs a multiple of 32 inputs, not {k}")
    groups = w.reshape(out, k // 32, 32)
    d = np.abs(groups).max(axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        scaled = groups * np.where(d == 0, np.float32(0), np.float32(1) / d)
    a = np.abs(scaled)
    q = np.sign(scaled) * (np.floor(a) + np.floor(2 * (a - np.floor(a))))  # half away from 0
    codes = (q.astype(np.int16) + 128).astype(np.uint8).reshape(out, k)
    d16 = d[..., 0].astype(np.float16)
    biases = (d16 * np.float16(-128)).astype(np.float16)  # exact: a power of two
    return QuantizedWeight(np.ascontiguousarray(codes).view(np.uint32), d16, biases, 32, 8, "Q8_0")


def dequantize(w: QuantizedWeight) -> np.ndarray:
    """The float32 [out, in] matrix, each weight s * q + b rounded once: by the C kernel
    where it is built, else by the NumPy reference a block of rows at a time."""
    from kernels import gguf_quants, qmatmul

    if qmatmul.available() and qmatmul.supports(w.bits, w.group_size):
        return qmatmul.dequantize(
            qmatmul.QMatrix.from_arrays(w.packed, w.scales, w.biases, w.group_size, w.bits)
        )
    return gguf_quants.dequantize_affine(
        _numpy(w.packed), _numpy(w.scales), _numpy(w.biases), w.group_size, w.bits
    )


def _numpy(a: Any) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    import mlx.core as mx

    return np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)
