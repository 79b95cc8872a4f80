"""What the C kernels behind `kernels.qmatmul` compute, as plain float64 NumPy: the
definitions tests/kernels/test_qmatmul.py checks every code path (AVX-512, AVX2, portable C)
against.
"""

from __future__ import annotations

import numpy as np

from kernels.qmatmul import QMatrix


def dequantize_reference(qm: QMatrix) -> np.ndarray:
    """float64 [n, k]: element j of a row at bits (j % (32/bits)) * bits of word j // (32/bits)."""
    n, k = qm.shape
    per_word = 32 // qm.bits
    shifts = (np.arange(per_word, dtype=np.uint32) * qm.bits)[None, None, :]
    q = (qm.packed[:, :, None] >> shifts) & np.uint32((1 << qm.bits) - 1)  # [n, words, per_word]
    q = q.reshape(n, k // qm.group_size, qm.group_size).astype(np.float64)
    w = q * qm.scales[:, :, None].astype(np.float64) + qm.biases[:, :, None].astype(np.float64)
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
