"""What the integer kernels behind `kernels.int8_matmul` compute, in plain NumPy: the
definition every code path (AVX-512 VNNI, AVX-VNNI, AVX2, portable C) is tested against
(tests/kernels/test_int8_matmul.py).

Activations are quantized as llama.cpp's Q8_0 blocks: each row in blocks of 32,
d = max|x| / 127 and xq = round-half-even(x / d) as int8 (d = 0: zeros). For output j,
group g (scale s, bias b: W = s * q + b) and each 32-block the group overlaps, with isum
and xsum the integer sums of q * xq and of xq over that overlap:

    t  = fma(d, isum, t)        xb = fma(d, xsum, xb)          (both from 0, blocks in order)
    acc_s = fma(s, t, acc_s)    acc_b = fma(b, xb, acc_b)      (groups in order)
    out_j = acc_s + acc_b

in float32 (kernels/csrc/int8.h). fma here is float64 product plus addend, rounded to
float32: the same as a fused multiply-add but for a rare double rounding (one ulp).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
BLOCK = 32


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(F32)


def quantize_x(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x float32 [m, k] -> xq int8 [m, k], d float32 [m, k / 32]."""
    m, k = x.shape
    blocks = np.asarray(x, dtype=F32).reshape(m, k // BLOCK, BLOCK)
    d = (np.abs(blocks).max(axis=-1) / F32(127)).astype(F32)  # [m, k/32]
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    xq = np.rint(blocks * inv[..., None]).astype(np.int8)  # rint: half to even
    return xq.reshape(m, k), d


def _portions(k: int, group_size: int) -> list[tuple[int, int, int, int]]:
    """(group, block, start, stop) for each group's overlap with each 32-block, in order."""
    found = []
    for g in range(k // group_size):
        e, end = g * group_size, (g + 1) * group_size
        while e < end:
            b = e // BLOCK
            stop = min((b + 1) * BLOCK, end)
            found.append((g, b, e, stop))
            e = stop
    return found


def bias_sums(xq: np.ndarray, d: np.ndarray, group_size: int) -> np.ndarray:
    """xb float32 [m, k / group_size]: per group, fma(d_b, xsum, .) over its blocks."""
    m, k = xq.shape
    xb = np.zeros((m, k // group_size), dtype=F32)
    for g, b, start, stop in _portions(k, group_size):
        xsum = xq[:, start:stop].astype(np.int64).sum(axis=1).astype(F32)
        xb[:, g] = _fma(d[:, b], xsum, xb[:, g])
    return xb


def matmul_reference(
    x: np.ndarray, q: np.ndarray, scales: np.ndarray, biases: np.ndarray, group_size: int
) -> np.ndarray:
    """out float32 [m, n] = x [m, k] @ (s * q + b)^T by the integer arithmetic above;
    q: unsigned ints [n, k], scales/biases [n, k / group_size]."""
    xq, d = quantize_x(np.asarray(x, dtype=F32))
    xb = bias_sums(xq, d, group_size)
    m, k = xq.shape
    n = q.shape[0]
    s, b = scales.astype(F32), biases.astype(F32)
    acc_s = np.zeros((m, n), dtype=F32)
    acc_b = np.zeros((m, n), dtype=F32)
    qi, xi = q.astype(np.int64), xq.astype(np.int64)
    portions = _portions(k, group_size)
    for g in range(k // group_size):
        t = np.zeros((m, n), dtype=F32)
        for _, blk, start, stop in (p for p in portions if p[0] == g):
            isum = (xi[:, start:stop] @ qi[:, start:stop].T).astype(F32)  # [m, n], exact
            t = _fma(d[:, blk, None], isum, t)
        acc_s = _fma(s[None, :, g], t, acc_s)
        acc_b = _fma(b[None, :, g], xb[:, g, None], acc_b)
    return (acc_s + acc_b).astype(F32)
