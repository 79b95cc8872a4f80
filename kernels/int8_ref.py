"""What the integer kernels behind `kernels.int8_matmul` compute, in plain NumPy: the
definition every code path (AVX-512 VNNI, AVX-VNNI, AVX2, portable C) is tested against
(tests/kernels/test_int8_matmul.py).

Activations are quantized as llama.cpp's Q8_0 blocks: each row in blocks of 32,
d = max|x| / 127 and xq = round-half-even(x * (1 / d)) as int8 (d = 0: zeros). Against
8-bit weights a second level follows: the residual fma(-d, xq, x) quantized the same way
(d2, xq2), so x carries ~15 bits there. For output j, group g (scale s, bias b:
W = s * q + b) and each 32-block the group overlaps, with isum and xsum the integer sums
of q * xq and of xq over that overlap (isum2, xsum2 of xq2):

    t  = fma(d, isum, t)  [t = fma(d2, isum2, t)]         (from 0, blocks in order)
    xb = fma(d, xsum, xb)  [xb = fma(d2, xsum2, xb)]      (from 0, blocks in order)
    acc_s = fma(s, t, acc_s)    acc_b = fma(b, xb, acc_b)  (groups in order)
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


def levels(bits: int) -> int:
    """Levels of x against weights of `bits` (kernels/csrc/int8.h i8_levels)."""
    return 2 if bits == 8 else 1


def quantize_levels(x: np.ndarray, num_levels: int) -> tuple[np.ndarray, np.ndarray]:
    """x float32 [m, k] -> xq int8 [levels, m, k], d float32 [levels, m, k / 32]: the
    second level quantizes the residual fma(-d, xq, x)."""
    xq, d = quantize_x(x)
    if num_levels == 1:
        return xq[None], d[None]
    m, k = x.shape
    approx = d.astype(np.float64).repeat(BLOCK, axis=1) * xq.astype(np.float64)
    residual = (x.astype(np.float64) - approx).astype(F32)  # exact product, one rounding
    xq2, d2 = quantize_x(residual)
    return np.stack([xq, xq2]), np.stack([d, d2])


def quantize_x(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x float32 [m, k] -> xq int8 [m, k], d float32 [m, k / 32] (one level)."""
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
    """xb float32 [m, k / group_size] from xq [levels, m, k], d [levels, m, k / 32]: per
    group, fma(d_b, xsum, .) over its blocks, each level in turn."""
    _, m, k = xq.shape
    xb = np.zeros((m, k // group_size), dtype=F32)
    for g, b, start, stop in _portions(k, group_size):
        for level in range(xq.shape[0]):
            xsum = xq[level, :, start:stop].astype(np.int64).sum(axis=1).astype(F32)
            xb[:, g] = _fma(d[level, :, b], xsum, xb[:, g])
    return xb


def matmul_reference(
    x: np.ndarray,
    q: np.ndarray,
    scales: np.ndarray,
    biases: np.ndarray,
    group_size: int,
    bits: int,
) -> np.ndarray:
    """out float32 [m, n] = x [m, k] @ (s * q + b)^T by the integer arithmetic above;
    q: unsigned ints [n, k] of `bits`, scales/biases [n, k / group_size]."""
    xq, d = quantize_levels(np.asarray(x, dtype=F32), levels(bits))
    xb = bias_sums(xq, d, group_size)
    _, m, k = xq.shape
    n = q.shape[0]
    s, b = scales.astype(F32), biases.astype(F32)
    acc_s = np.zeros((m, n), dtype=F32)
    acc_b = np.zeros((m, n), dtype=F32)
    qi, xi = q.astype(np.int64), xq.astype(np.int64)
    portions = _portions(k, group_size)
    for g in range(k // group_size):
        t = np.zeros((m, n), dtype=F32)
        for _, blk, start, stop in (p for p in portions if p[0] == g):
            for level in range(xq.shape[0]):
                isum = (xi[level, :, start:stop] @ qi[:, start:stop].T).astype(F32)  # exact
                t = _fma(d[level, :, blk, None], isum, t)
        acc_s = _fma(s[None, :, g], t, acc_s)
        acc_b = _fma(b[None, :, g], xb[:, g, None], acc_b)
    return (acc_s + acc_b).astype(F32)
