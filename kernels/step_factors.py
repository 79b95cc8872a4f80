"""K-quant group factors for the step's table: a super-block's float16 scale times small
integer codes instead of a float32 scale and bias a group.

GGUF's K-quants store per super-block of 256 weights one or two float16 factors and per
group of 16 or 32 a 4..8-bit integer (kernels/gguf_quants.py); the loader hands the step
their products as float32, s and b a group: 8 bytes a group, 2 bits a weight of Q4_K's
4.5. This module recovers a factorisation the kernel can multiply out again, bit for bit:

    "min" parts (Q4_K, Q5_K, Q2_K):  s = d * sc, b = -(dmin * m), sc and m in 0..63
        -> a uint16 code a group (sc | m << 8) and float16 (d, dmin) a super-block
    "signed" parts (Q6_K, Q3_K):     s = d * sc, b = (-2^(bits-1)) * s, sc in -128..127
        -> a uint16 code a group (sc + 128) and float16 (d, 0) a super-block

2.5 bytes a group where the table held 8. The factors need not be the file's: any float16
d and integers whose float32 product equals every s (and b) of the super-block bit for bit
serve (products of a float16 and an integer of at most 8 bits are exact in float32, so the
kernel's multiply rounds nothing). A part any of whose super-blocks has no such
factorisation (a file written by another quantizer) stays in float32 s and b.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SUPER = 256  # weights a super-block
MIN_KIND, SIGNED_KIND = 64, 128  # added to the bits: the step's format codes
# each type's kind and its codes' range (a 6-bit sc and m; Q2_K's 4 bits; Q6_K's int8;
# Q3_K's sc - 32): the search below tries no wider code than the file can hold
_KINDS = {"Q4_K": (MIN_KIND, 0, 63), "Q5_K": (MIN_KIND, 0, 63), "Q2_K": (MIN_KIND, 0, 15),
          "Q6_K": (SIGNED_KIND, -128, 127), "Q3_K": (SIGNED_KIND, -32, 31)}  # fmt: skip


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.view(np.uint32) == b.view(np.uint32)


def _times(d: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """float32(d) * codes in float32, as the kernel multiplies them"""
    return d.astype(np.float32)[:, None] * codes.astype(np.float32)


def _factor(v: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray] | None:
    """v [blocks, G] float32 -> (d float16 [blocks], codes int32 [blocks, G] in lo..hi) with
    float32(d) * codes == v bit for bit, or None where some block has none. Tried first:
    the block's largest |v| as d times the widest code (llama.cpp's quantizers give the
    largest scale of a super-block the widest code), then its smallest nonzero |v| as d
    times 1, 2, ... (either sign), which finds the rest in a few passes."""
    blocks = v.shape[0]
    d = np.zeros(blocks, dtype=np.float16)
    codes = np.zeros(v.shape, dtype=np.int32)
    big = np.take_along_axis(v, np.abs(v).argmax(axis=1)[:, None], axis=1)[:, 0]
    nonzero = np.where(v != 0, np.abs(v), np.inf).argmin(axis=1)
    small = np.take_along_axis(v, nonzero[:, None], axis=1)[:, 0]
    # an all-zero block (d = 0 in the file): +0 or -0 each, as 0 * 0 or 0 * -1 (or all -0
    # as -0 * 0); other mixtures fail the check below
    zero = big == 0
    negative = np.signbit(v[zero])
    if lo < 0:
        codes[zero] = np.where(negative, -1, 0)
    else:
        d[zero] = np.where(negative.all(axis=1), np.float16(-0.0), np.float16(0.0))
    left = np.flatnonzero(~zero)
    widest = [(big, c) for c in (hi, -hi, lo) if c and lo <= c <= hi]  # Q6_K's d < 0: -128
    rest = [(small, c) for m in range(1, max(hi, -lo) + 1) for c in (m, -m) if lo <= c <= hi]
    for ref, c in widest + rest:
        if left.size == 0:
            break
        with np.errstate(all="ignore"):
            cand = (ref[left] / np.float32(c)).astype(np.float16)
            f = cand.astype(np.float32)[:, None]
            q = np.rint(v[left] / f)
        ok = np.isfinite(f[:, 0]) & (f[:, 0] != 0)
        ok &= np.all((q >= lo) & (q <= hi), axis=1)
        qi = np.where(np.isfinite(q), q, 0).astype(np.int32)
        ok &= np.all(_same_bits((f * qi.astype(np.float32)).astype(np.float32), v[left]), axis=1)
        d[left[ok]], codes[left[ok]] = cand[ok], qi[ok]
        left = left[~ok]
    if left.size or not np.all(_same_bits(_times(d, codes), v)):
        return None
    return d, codes


def factors(source: str, bits: int, scales: Any, biases: Any) -> tuple[int, Any, Any] | None:
    """(format code, codes uint16 [rows, groups], supers float16 [rows, supers, 2]) for a
    part converted from GGUF type `source` with float32 `scales` / `biases` [rows, groups],
    or None (not a K-quant, or not exactly factorable)."""
    if source not in _KINDS:
        return None
    kind, lo, hi = _KINDS[source]
    s = np.asarray(scales, dtype=np.float32)
    b = np.asarray(biases, dtype=np.float32)
    rows, groups = s.shape
    cols = groups * (32 if source in ("Q4_K", "Q5_K") else 16)  # Q6_K, Q3_K, Q2_K: 16
    if cols % SUPER:
        return None
    g = groups // (cols // SUPER)  # groups a super-block
    sv, bv = s.reshape(-1, g), b.reshape(-1, g)
    if kind == MIN_KIND:
        fs, fm = _factor(sv, lo, hi), _factor(-bv, lo, hi)
        if fs is None or fm is None:
            return None
        # -(dmin * m) must give b's bits, zeros' signs included
        if not np.all(_same_bits(-_times(*fm), bv)):
            return None
        codes = fs[1] | (fm[1] << 8)
        supers = np.stack([fs[0], fm[0]], axis=-1)
    else:
        fs = _factor(sv, lo, hi)
        offset = np.float32(-(1 << (bits - 1)))
        if fs is None or not np.all(_same_bits(offset * sv, bv)):
            return None
        codes = fs[1] + 128
        supers = np.stack([fs[0], np.zeros_like(fs[0])], axis=-1)
    return (
        kind + bits,
        codes.astype(np.uint16).reshape(rows, groups),
        supers.reshape(rows, -1, 2),
    )
