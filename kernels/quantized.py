"""An affine-quantized weight in MLX's layout, as the loaders hand it to `Ops.weight`.

Its own module because the op set (kernels/ops.py) and both backends that take it
(kernels/ops_numpy.py, kernels/ops_mlx.py) import it, and the op set imports the backends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
