"""What the C kernels behind `kernels.qmatmul` compute, as plain float64 NumPy: the
definitions tests/kernels/test_qmatmul.py checks every code path (AVX-512, AVX2, portable C)
against.
"""

from __future__ import annotations

import numpy as np

from kernels.gguf_quants import unpack_bits
from kernels.qmatmul import QMatrix


def dequantize_reference(qm: QMatrix) -> np.ndarray:
    """float64 [n, k]: element j of a row at bits [j * bits, (j + 1) * bits) of the row's
    little-endian bit stream (MLX's layout, any width), w = s * q + b per group."""
    n, k = qm.shape
    q = unpack_bits(qm.packed, qm.bits).reshape(n, k // qm.group_size, qm.group_size)
    s, b = qm.scales.astype(np.float64), qm.biases.astype(np.float64)
    w = q.astype(np.float64) * s[:, :, None] + b[:, :, None]
    return w.reshape(n, k)


def matmul_reference(x: np.ndarray, qm: QMatrix) -> np.ndarray:
    """x [m, k] @ W^T in float64."""
    return x.astype(np.float64) @ dequantize_reference(qm).T


def attention_reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: np.ndarray | None
) -> np.ndarray:
    """float64 softmax attention with GQA: q [Hq, L, D], k/v [Hkv, S, D], mask [L, S]."""
    Hq, L, D = q.shape
    G = Hq // k.shape[0]
    out = np.empty((Hq, L, D))
    for h in range(Hq):
        s = (q[h].astype(np.float64) @ k[h // G].T.astype(np.float64)) * scale
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        out[h] = (p / p.sum(axis=-1, keepdims=True)) @ v[h // G].astype(np.float64)
    return out
