"""Matrix products against MLX affine-quantized weights on the CPU, kept packed.

Decode on a CPU is bound by the bytes of weights read per token: the default model's
weights take ~540 MB dequantized to float32 but ~98 MB packed, so the C kernel
(kernels/csrc/, built by setup.py) multiplies against the packed rows directly, up to
8 rows of x per pass over the weights (a speculative verify). Above KERNEL_MAX_ROWS rows
(a long prefill) BLAS wins on a float32 copy of the weight, dequantized a block of rows
at a time into a reused scratch buffer.

`kernels.qmatmul_ref` holds the plain float64 definitions the kernel is tested against
(tests/kernels/test_qmatmul.py).
"""

from __future__ import annotations

import importlib
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

ABI_VERSION = 4  # kernels/csrc/module.c's; a stale build from older sources is not used


def _load_extension() -> Any:
    try:
        ext = importlib.import_module("kernels._qmatmul")
    except ImportError:  # not built (no compiler at install time): the NumPy path serves
        return None
    return ext if getattr(ext, "ABI_VERSION", None) == ABI_VERSION else None


_ext = _load_extension()

F32 = np.float32
F16 = np.float16
SUPPORTED_BITS = (2, 3, 4, 5, 6, 8)
# Up to this many rows the kernel beats dequantize + BLAS; measured on the 2-core dev
# machine (default model prefill, tok/s kernel vs BLAS): 37 rows 596 vs 418, 64 rows 664
# vs 637, 96 rows 761 vs 774, 128 rows 631 vs 761, 512 rows 554 vs 615.
KERNEL_MAX_ROWS = 64
# Float32 elements of the dequantized block handed to BLAS (8 MB: stays in the L3 cache).
BLAS_BLOCK_ELEMENTS = 1 << 21


def available() -> bool:
    """Whether the C kernel is built and importable."""
    return _ext is not None


def enabled(requested: bool | None = None) -> bool:
    """Whether the numpy backend should hold quantized weights packed for this kernel.

    requested False turns it off, True on where the kernel is built; None (the default)
    turns it on where a SIMD code path was built (AVX2 or AVX-512): the portable C one is
    no faster than BLAS on float32.
    """
    if not available() or requested is False:
        return False
    return requested is True or _ext.info()["isa"] != "generic"


def default_num_threads() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def set_num_threads(n: int) -> None:
    if n < 1:
        raise ValueError(f"the thread count must be at least 1, not {n}")
    if _ext is not None:
        _ext.set_num_threads(n)


if _ext is not None:
    _ext.set_num_threads(default_num_threads())


@dataclass(frozen=True)
class QMatrix:
    """A quantized [n, k] weight as the kernel takes it: W[j] = scales * q + biases per group.

    packed: uint32 [n, k * bits / 32] (MLX's layout: bits 2, 3, 4, 5, 6 or 8, groups of 16
    or a multiple of 32, k a multiple of 32); scales/biases: [n, k / group], both
    float16 (what GGUF and most MLX models store: 2 bytes a group fewer to read) or both
    float32 (when float16 cannot hold them exactly).
    """

    packed: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    group_size: int
    bits: int

    def __post_init__(self) -> None:
        n, words = self.packed.shape
        k = words * 32 // self.bits
        if self.bits not in SUPPORTED_BITS:
            raise ValueError(f"bits must be one of {SUPPORTED_BITS}, not {self.bits}")
        if not supports(self.bits, self.group_size) or k % self.group_size or k % 32:
            raise ValueError(
                f"group_size {self.group_size} must be 16 or a multiple of 32 dividing k={k} "
                "(a multiple of 32)"
            )
        if self.scales.shape != (n, k // self.group_size) or self.biases.shape != self.scales.shape:
            raise ValueError("scales and biases must be [n, k / group_size]")
        if self.scales.dtype != self.biases.dtype or self.scales.dtype not in (F16, F32):
            raise ValueError("scales and biases must both be float16 or both float32")

    @classmethod
    def from_arrays(
        cls, packed: Any, scales: Any, biases: Any, group_size: int, bits: int
    ) -> QMatrix:
        """From any array type NumPy can read (MLX arrays included); the scales and biases
        are held in float16 when that is exact, else in float32."""
        s, b = _to_numpy(scales).astype(F32), _to_numpy(biases).astype(F32)
        s16, b16 = s.astype(F16), b.astype(F16)
        exact = np.array_equal(s16.astype(F32), s) and np.array_equal(b16.astype(F32), b)
        return cls(
            np.ascontiguousarray(_to_numpy(packed), dtype=np.uint32),
            np.ascontiguousarray(s16 if exact else s),
            np.ascontiguousarray(b16 if exact else b),
            group_size,
            bits,
        )

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.packed.shape[0]), int(self.packed.shape[1]) * 32 // self.bits)

    @property
    def nbytes(self) -> int:
        return int(self.packed.nbytes + self.scales.nbytes + self.biases.nbytes)

    def can_concat(self, others: list[QMatrix]) -> bool:
        key = (self.bits, self.group_size, self.shape[1])
        return all((q.bits, q.group_size, q.shape[1]) == key for q in others)

    def concat(self, others: list[QMatrix]) -> QMatrix:
        """The rows of self then of each of `others` (a fused QKV or gate/up projection)."""
        if not self.can_concat(others):
            raise ValueError("only matrices with equal bits, group size and k concat")
        parts = [self, *others]
        # float16 factors where every part has them, else all float32 (exact either way)
        dtype = np.result_type(*(q.scales.dtype for q in parts))
        return QMatrix(
            np.concatenate([q.packed for q in parts]),
            np.concatenate([q.scales for q in parts]).astype(dtype, copy=False),
            np.concatenate([q.biases for q in parts]).astype(dtype, copy=False),
            self.group_size,
            self.bits,
        )


def supports(bits: int, group_size: int) -> bool:
    groups_ok = group_size == 16 or (group_size > 0 and group_size % 32 == 0)
    return bits in SUPPORTED_BITS and groups_ok


def _to_numpy(a: Any) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    import mlx.core as mx

    if a.dtype == mx.bfloat16:  # NumPy has no bfloat16; float32 holds it exactly
        a = a.astype(mx.float32)
    return np.array(a)


def _args(qm: QMatrix) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    return qm.packed, qm.scales, qm.biases, qm.group_size, qm.bits


def _require_ext() -> Any:
    if _ext is None:
        raise RuntimeError("kernels._qmatmul is not built (pip install -e . builds it)")
    return _ext


# -- the fast path -----------------------------------------------------------------------


def matmul(x: np.ndarray, qm: QMatrix, out: np.ndarray | None = None) -> np.ndarray:
    """x [..., k] @ W^T -> [..., n] in float32: the kernel for few rows, BLAS for many.

    out: a float32 [m, n] array (m rows of x) to fill and return instead, such as one
    part's columns of a wider output (kernels/row_parts.py); the kernel writes straight
    into a C-contiguous one (a decode row's slice), any other gets a copy of the result.
    """
    ext = _require_ext()
    n = qm.packed.shape[0]
    x2 = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])  # [m, k]
    if x2.dtype != F32 or not x2.flags.c_contiguous:
        x2 = np.ascontiguousarray(x2, dtype=F32)
    m = x2.shape[0]
    if out is not None and out.shape != (m, n):
        raise ValueError(f"out must be [{m}, {n}], not {list(out.shape)}")
    direct = out if out is not None and out.dtype == F32 and out.flags.c_contiguous else None
    if m <= KERNEL_MAX_ROWS:
        result = direct if direct is not None else np.empty((m, n), dtype=F32)
        ext.matmul(x2, qm.packed, qm.scales, qm.biases, qm.group_size, qm.bits, result)
    else:
        result = _matmul_blocked(x2, qm)
    if out is not None:
        if result is not out:
            out[...] = result
        return out
    return result if x.ndim == 2 else result.reshape(*x.shape[:-1], n)


_scratch = threading.local()


def _scratch_buffer(elements: int) -> np.ndarray:
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < elements:
        buf = np.empty(max(elements, BLAS_BLOCK_ELEMENTS), dtype=F32)
        _scratch.buf = buf
    return buf


def _matmul_blocked(x: np.ndarray, qm: QMatrix) -> np.ndarray:
    """x @ W^T through BLAS, W dequantized a block of rows at a time into a reused buffer."""
    ext = _require_ext()
    n, k = qm.shape
    block = max(1, min(n, BLAS_BLOCK_ELEMENTS // k))
    scratch = _scratch_buffer(block * k)
    out = np.empty((x.shape[0], n), dtype=F32)
    for start in range(0, n, block):
        stop = min(n, start + block)
        w = scratch[: (stop - start) * k].reshape(stop - start, k)  # [rows, k]
        ext.dequantize(*_row_slice(qm, start, stop), w)
        if start == 0 and stop == n:
            np.matmul(x, w.T, out=out)
        else:
            out[:, start:stop] = x @ w.T
    return out


def _row_slice(qm: QMatrix, start: int, stop: int) -> tuple[Any, ...]:
    return (
        qm.packed[start:stop],
        qm.scales[start:stop],
        qm.biases[start:stop],
        qm.group_size,
        qm.bits,
    )


def dequantize(qm: QMatrix) -> np.ndarray:
    """The float32 [n, k] matrix."""
    out = np.empty(qm.shape, dtype=F32)
    _require_ext().dequantize(*_args(qm), out)
    return out


def embed_rows(qm: QMatrix, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of the dequantized matrix: [len(ids), k] float32 (an embedding lookup)."""
    rows = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    out = np.empty((rows.shape[0], qm.shape[1]), dtype=F32)
    _require_ext().dequantize(*_args(qm), out, rows)
    return out


# Query rows per head up to which the C attention always serves (decode, verify: each
# row computed alone, however many came); above, a prefill chunk, only where its prefill
# tiles are built (AVX-512, head dims a multiple of 64 up to 256: ATTN_MANY_ROWS and
# ATTN_PREFILL_DIM in csrc/attention.h). Measured on the loaded 2-core dev machine
# (`python -m bench attention --prefill`, 256 rows at 512..8192 keys): 3-8x NumPy's BLAS
# path on the default model's heads, 1-2x on Gemma 3's.
ATTENTION_MAX_ROWS = 64
ATTENTION_MAX_DIM = 512  # head dims it takes (ATTN_MAX_DIM in csrc/qmatmul.h)
ATTENTION_PREFILL_DIM = 256


def attention_serves(rows: int, head_dim: int) -> bool:
    """Whether the C attention is the fast path for `rows` query rows per head."""
    if _ext is None or head_dim > ATTENTION_MAX_DIM:
        return False
    if rows <= ATTENTION_MAX_ROWS:
        return True
    prefill_tiles = head_dim % 64 == 0 and head_dim <= ATTENTION_PREFILL_DIM
    return prefill_tiles and _ext.info()["isa"] == "avx512"


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: np.ndarray | None
) -> np.ndarray:
    """softmax(scale q k^T, mask) v per head, GQA: q [Hq, L, D] float32, k/v [Hkv, S, D]
    both float32 or both float16 (views of the KV buffers, read in place), mask bool
    [L, S] (True: visible) or None. Each row is computed alone: its result does not depend
    on the other rows or the thread count. A row that sees no key is zeros."""
    out = np.empty(q.shape, dtype=F32)
    m = None if mask is None else np.ascontiguousarray(mask, dtype=np.bool_)
    _require_ext().attention(np.ascontiguousarray(q, dtype=F32), k, v, float(scale), m, out)
    return out


def ring_attention(
    q: np.ndarray,
    ring: tuple[np.ndarray, np.ndarray, np.ndarray],
    new_rows: tuple[np.ndarray, np.ndarray],
    offset: int,
    window: int,
    scale: float,
) -> np.ndarray:
    """A sliding window's attention as the C step computes it (kernels/csrc/step.c): query
    row l of q [Hq, L, D], at position offset + l, over keys (pos - window, pos] by
    position: below offset from the ring (keys, values [Hkv, size, D], positions [size]:
    position p in slot p % size where positions[slot] == p), from offset on the call's own
    rows new_rows (k, v [Hkv, L, D]). K/V all float32 or all float16, C-contiguous."""
    keys, values, positions = ring
    out = np.empty(q.shape, dtype=F32)
    _require_ext().ring_attention(
        np.ascontiguousarray(q, dtype=F32),
        keys,
        values,
        np.ascontiguousarray(positions, dtype=np.int64),
        *new_rows,
        int(offset),
        int(window),
        float(scale),
        out,
    )
    return out
