"""The CUDA sources of the GPU kernels, read by their Python wrappers when a kernel is built.

MLX's `mx.fast.cuda_kernel` takes a kernel's body and a header as text and wraps the body
in a `__global__` function whose parameters are the named inputs and outputs, so a `.cu`
file here holds a body (the statements of one kernel) and a `.cuh` file device code for
the header. They ship as package data (pyproject.toml).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import mlx.core as mx

_HERE = Path(__file__).parent


@cache
def source(name: str) -> str:
    """The text of kernels/cuda/`name`."""
    return (_HERE / name).read_text(encoding="utf-8")


def is_available() -> bool:
    """True where MLX's default device is a CUDA GPU (where these kernels are built)."""
    try:
        return bool(mx.default_device() == mx.gpu and mx.cuda.is_available())
    except AttributeError:  # an MLX without a CUDA module (Metal, the CPU build)
        return False
