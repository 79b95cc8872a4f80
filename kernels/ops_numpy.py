"""The CPU fast path: every op in NumPy, float32, matrices through NumPy's BLAS.

MLX's CPU backend multiplies at ~7 GFLOP/s and pays ~60 us per evaluated graph on the
Linux wheel, where OpenBLAS reaches ~180 GFLOP/s on the same cores (measured on the
2-core dev machine), so on a CPU the whole forward runs here.

Quantized weights (2 to 8 bits, groups of 16 or a multiple of 32) stay packed when the C
kernel is built: decode reads ~5x fewer bytes per token than from a float32 copy. They
are held as `kernels.int8_matmul.Int8Matrix` (integer dot products against int8-quantized
activations, `cpu_matmul="int8"`, the default where an int8 SIMD path runs) or as
`kernels.qmatmul.QMatrix` (dequantized to float32 in registers, `cpu_matmul="float"`).
Other weights (and every weight when the kernel is not built or is switched off,
`make_ops(qmatmul=False)`) are dequantized once at load into the layout BLAS wants. A
fused projection whose parts are packed differently stays packed as
`kernels.row_parts.RowParts`, one kernel call per part.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels import gated_delta, int8_matmul, qmatmul, quantized
from kernels.int8_matmul import Int8Matrix
from kernels.masks import CausalMask, WindowMask
from kernels.qmatmul import QMatrix
from kernels.quantized import QuantizedWeight, quantize_q8_0
from kernels.row_parts import RowParts, join_runs

F32 = np.float32
F16 = np.float16
KV_DTYPES = {"float16": F16, "float32": F32}
# A query block's float32 scores [Hq, rows, S] hold at most this many elements (32 MB), so
# a long prompt's prefill over an 8k context never materialises [Hq, L, S] whole.
SCORES_BLOCK_ELEMENTS = 1 << 23


def _as_f32(x: Any) -> np.ndarray:
    if isinstance(x, QuantizedWeight):  # in float32, each weight rounded once
        return quantized.dequantize(x)
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x, dtype=F32)
    import mlx.core as mx

    return np.array(x.astype(mx.float32), dtype=F32)


Packed = QMatrix | Int8Matrix
Weight = np.ndarray | Packed | RowParts  # what `NumpyOps.weight` and `concat_weights` give


def _packed_kind(w: np.ndarray | Packed) -> tuple[type, int, int, int] | None:
    """Which neighbours a part joins into one packed matrix; dense parts keep their own
    matmul (BLAS need not give a column the same value in a wider matrix)."""
    if isinstance(w, (QMatrix, Int8Matrix)):
        return (type(w), w.bits, w.group_size, w.shape[1])
    return None


def _rows_of(w: np.ndarray | Packed) -> int:
    return w.shape[1] if isinstance(w, np.ndarray) else w.shape[0]  # dense is [in, out]


def _use_int8(packed: bool, cpu_matmul: str | None) -> bool:
    """Whether packed weights take the int8 kernel (see EngineConfig.cpu_matmul)."""
    if cpu_matmul not in (None, "int8", "float"):
        raise ValueError(f"cpu_matmul must be 'int8' or 'float', not {cpu_matmul!r}")
    if cpu_matmul == "int8" and not (packed and int8_matmul.available()):
        raise ValueError("cpu_matmul='int8' needs the C kernel built and packed weights on")
    if cpu_matmul is None:
        return packed and int8_matmul.has_simd()
    return cpu_matmul == "int8"


class NumpyOps:
    name = "numpy"
    dtype = F32

    def __init__(
        self, packed: bool | None = None, cpu_matmul: str | None = None, kv_dtype: str | None = None
    ) -> None:
        if kv_dtype is not None and kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {list(KV_DTYPES)}, not {kv_dtype!r}")
        self._rope_cache: dict[tuple[int, float | bytes], tuple[np.ndarray, np.ndarray]] = {}
        if packed is None and cpu_matmul != "float" and int8_matmul.has_simd():
            packed = True  # the int8 paths are picked at run time, even in a portable build
        self.packed = qmatmul.enabled(packed)
        self.cpu_matmul = "int8" if _use_int8(self.packed, cpu_matmul) else "float"
        # K/V rows in float16 by default: at a 2k context a decode step reads as many
        # bytes of float32 K/V as of packed weights. Rows are rounded once, when written.
        self.kv_dtype = KV_DTYPES[kv_dtype or "float16"]

    # -- weights -------------------------------------------------------------------
    def weight(self, w: Any) -> np.ndarray | Packed:
        if (
            self.packed
            and isinstance(w, QuantizedWeight)
            and qmatmul.supports(w.bits, w.group_size)
        ):
            qm = QMatrix.from_arrays(w.packed, w.scales, w.biases, w.group_size, w.bits)
            return Int8Matrix.from_qmatrix(qm) if self.cpu_matmul == "int8" else qm
        # Stored transposed ([in, out], contiguous) so x @ w streams rows: measured
        # ~10% faster than x @ w.T for decode-sized x on OpenBLAS.
        return np.ascontiguousarray(_as_f32(w).T)

    def compact_weight(self, w: Any) -> Weight:
        """A float matrix whose reader tolerates a weight's rounding (a drafter's: the
        target verifies what it proposes) in Q8_0 where the int8 kernel runs, a quarter
        of float32's bytes a pass; else as `weight`."""
        return self.weight(quantize_q8_0(w) if self.cpu_matmul == "int8" else w)

    def norm_weight(self, w: Any) -> np.ndarray:
        return _as_f32(w)

    def concat_weights(self, ws: list[np.ndarray | Packed]) -> Weight:
        """`weight`s' rows in one weight (a fused projection)."""
        dense = [w for w in ws if isinstance(w, np.ndarray)]
        if len(dense) == len(ws):  # all dense: one BLAS matrix
            return np.ascontiguousarray(np.concatenate(dense, axis=1))
        parts = join_runs(ws, _packed_kind, lambda run: run[0].concat(run[1:]))
        if len(parts) == 1:
            return parts[0]
        # parts packed differently (Gemma 3's Q5_0 q|k and Q8_0 v) stay packed, each its own
        # matmul; one dense float32 copy would be ~5x the bytes a decode step reads
        k = parts[0].shape[0] if isinstance(parts[0], np.ndarray) else parts[0].shape[1]
        return RowParts(tuple(parts), tuple(_rows_of(p) for p in parts), k)

    # -- arrays --------------------------------------------------------------------
    def asarray(self, x: Any) -> np.ndarray:
        return _as_f32(x)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return x

    def linear(self, x: np.ndarray, w: Weight) -> np.ndarray:
        if isinstance(w, Int8Matrix):
            return int8_matmul.matmul(x, w)
        if isinstance(w, QMatrix):
            return qmatmul.matmul(x, w)
        if isinstance(w, RowParts):
            return self._linear_parts(x, w)
        return x @ w

    def _linear_parts(self, x: np.ndarray, w: RowParts) -> np.ndarray:
        """x @ W^T a part at a time, each into its columns of one output: exactly the
        separate matmuls' numbers (the kernel writes a decode row's slice in place)."""
        n, k = w.shape
        x2 = x.reshape(-1, k)  # [m, k]
        out = np.empty((x2.shape[0], n), dtype=F32)
        for part, (start, stop) in zip(w.parts, w.bounds, strict=True):
            if isinstance(part, Int8Matrix):
                int8_matmul.matmul(x2, part, out=out[:, start:stop])
            elif isinstance(part, QMatrix):
                qmatmul.matmul(x2, part, out=out[:, start:stop])
            else:
                out[:, start:stop] = x2 @ part
        return out.reshape(*x.shape[:-1], n)

    def embed(self, table: Weight, ids: np.ndarray) -> np.ndarray:
        if isinstance(table, Int8Matrix):  # [vocab, hidden]: only the rows asked for
            return int8_matmul.embed_rows(table, ids)
        if isinstance(table, QMatrix):
            return qmatmul.embed_rows(table, ids)
        if isinstance(table, RowParts):
            out = np.empty((np.size(ids), table.shape[1]), dtype=F32)
            for part, positions, rows in table.locate(ids):
                out[positions] = self.embed(part, rows)
            return out
        # the table is held [hidden, vocab] like any weight, so a tied lm_head reuses it
        return np.ascontiguousarray(table[:, ids].T)

    def rms_norm(self, x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
        # np.mean's own result (sum, then divide), without its ~4 us of Python per call
        ms = np.add.reduce(np.square(x), axis=-1, keepdims=True) / x.shape[-1]
        y = x * (1.0 / np.sqrt(ms + eps)).astype(F32)
        return y * w if w is not None else y

    def _rope_table(
        self, dims: int, base: float, end: int, inv_freq: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        key = (dims, base) if inv_freq is None else (dims, inv_freq.tobytes())
        cached = self._rope_cache.get(key)
        if cached is None or cached[0].shape[0] < end:
            size = max(end, 2 * (cached[0].shape[0] if cached else 1024))
            if inv_freq is None:
                inv_freq = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
            freqs = np.asarray(inv_freq, dtype=np.float64)
            angles = np.arange(size, dtype=np.float64)[:, None] * freqs[None, :]
            cached = (np.cos(angles).astype(F32), np.sin(angles).astype(F32))
            self._rope_cache[key] = cached
        return cached

    def rope(
        self,
        x: np.ndarray,
        offset: int,
        dims: int,
        base: float,
        traditional: bool,
        inv_freq: np.ndarray | None = None,
        mscale: float = 1.0,
    ) -> np.ndarray:
        # x: [H, L, D]; rotate the first `dims` features of each head
        L = x.shape[1]
        cos, sin = self._rope_table(dims, base, offset + L, inv_freq)
        cos, sin = cos[offset : offset + L], sin[offset : offset + L]  # [L, dims/2]
        if mscale != 1.0:  # HF multiplies cos and sin: the rotated features only
            cos, sin = cos * F32(mscale), sin * F32(mscale)
        rot = x[..., :dims]
        if traditional:  # interleaved pairs (x0, x1), (x2, x3), ...
            a, b = rot[..., 0::2], rot[..., 1::2]
            out = np.empty_like(rot)
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = a * sin + b * cos
        else:  # halves (x[:d/2], x[d/2:]), the "rotate_half" form
            half = dims // 2
            a, b = rot[..., :half], rot[..., half:]
            out = np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
        if dims == x.shape[-1]:
            return out
        return np.concatenate([out, x[..., dims:]], axis=-1)

    def attention(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: Any
    ) -> np.ndarray:
        # q: [Hq, L, D] float32, k/v: [Hkv, S, D] float32 or float16 (the KV buffers),
        # mask: bool [L, S] (True = attend), a CausalMask, a WindowMask or None
        if isinstance(mask, (CausalMask, WindowMask)):
            mask = mask.array()
        if (
            self.packed
            and qmatmul.attention_serves(q.shape[1], q.shape[2])
            and k.dtype in (F32, F16)
            and v.dtype == k.dtype
            and k.strides[-1] == k.itemsize
            and v.strides[-1] == v.itemsize
        ):  # float32 or float16 K/V read in place, no [Hkv, G*L, S] scores: one C call
            return qmatmul.attention(q, k, v, scale, mask)
        # NumPy's BLAS path (no C kernel, or rows it does not serve): float16 rows widen
        # exactly, once per call; float32 views are used as they are
        k, v = k.astype(F32, copy=False), v.astype(F32, copy=False)
        Hq, L, D = q.shape
        block = max(1, SCORES_BLOCK_ELEMENTS // (Hq * k.shape[1]))
        if block >= L:  # one block holds every row
            return _attention_rows(q, k, v, scale, mask)
        out = np.empty((Hq, L, D), dtype=F32)
        for i in range(0, L, block):  # each query row's softmax is its own: blocks are exact
            rows_mask = None if mask is None else mask[i : i + block]
            out[:, i : i + block] = _attention_rows(q[:, i : i + block], k, v, scale, rows_mask)
        return out

    def silu(self, x: np.ndarray) -> np.ndarray:
        return x / (F32(1.0) + np.exp(-x))

    def gelu_tanh(self, x: np.ndarray) -> np.ndarray:
        # GELU's tanh approximation (Hendrycks & Gimpel 2016), PyTorch's approximate="tanh"
        inner = F32(np.sqrt(2.0 / np.pi)) * (x + F32(0.044715) * x * x * x)
        return F32(0.5) * x * (F32(1.0) + np.tanh(inner))

    def sigmoid(self, x: np.ndarray) -> np.ndarray:
        return F32(1.0) / (F32(1.0) + np.exp(-x))

    def softplus(self, x: np.ndarray) -> np.ndarray:
        return np.logaddexp(F32(0.0), x).astype(F32)

    def exp(self, x: np.ndarray) -> np.ndarray:
        return np.exp(x)

    def concat(self, xs: list[np.ndarray], axis: int) -> np.ndarray:
        return np.concatenate(xs, axis=axis)

    def split(self, x: np.ndarray, sizes: list[int], axis: int) -> list[np.ndarray]:
        if axis not in (-1, x.ndim - 1):
            return np.split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis)
        parts, start = [], 0  # views, like np.split's, at a tenth of its cost
        for size in sizes:
            parts.append(x[..., start : start + size])
            start += size
        return parts

    def zeros(self, shape: tuple[int, ...], dtype: Any = None) -> np.ndarray:
        return np.zeros(shape, dtype=dtype or F32)

    def write_rows(self, buf: np.ndarray, start: int, rows: np.ndarray) -> np.ndarray:
        # buf: [H, capacity, D], rows: [H, L, D]; in place (the buffer has one owner)
        end = start + rows.shape[1]
        if buf.dtype != F16 or rows.dtype == F16:
            buf[:, start:end] = rows
            return buf
        try:  # float32 rows rounded once, to nearest; past 65504 one would read back as inf
            with np.errstate(over="raise"):  # ~3 us, a quarter of an isinf pass
                buf[:, start:end] = rows
        except FloatingPointError:
            big = float(np.abs(rows).max())
            raise FloatingPointError(
                f"a K/V value of {big:.4g} exceeds float16's range; "
                "BRANCHCHAT_KV_DTYPE=float32 keeps K/V rows in float32"
            ) from None
        return buf

    def argmax_rows(self, x: np.ndarray) -> np.ndarray:
        return np.argmax(x, axis=-1)

    def top1_rows(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = _as_f32(x)
        top = np.argmax(x, axis=-1)
        peak = np.take_along_axis(x, top[:, None], axis=-1)
        return top, 1.0 / np.exp(x - peak).sum(axis=-1)  # the top term is exp(0) = 1

    def snapshot(self, x: np.ndarray) -> np.ndarray:
        return x.copy()

    def nbytes(self, x: np.ndarray) -> int:
        return int(x.nbytes)

    def evaluate(self, *xs: Any) -> None:
        return None

    def start(self, *xs: Any) -> None:
        return None

    # -- recurrent kernels -----------------------------------------------------------
    def gated_delta_recurrent(self, q, k, v, g, beta, state):  # type: ignore[no-untyped-def]
        return gated_delta.gated_delta_recurrent(q, k, v, g, beta, state)

    def gated_delta_chunked(self, q, k, v, g, beta, state):  # type: ignore[no-untyped-def]
        return gated_delta.gated_delta_chunked(q, k, v, g, beta, state)

    def causal_conv1d(self, x, weight, conv_state):  # type: ignore[no-untyped-def]
        return gated_delta.causal_conv1d(x, weight, conv_state)

    def conv_state_after(self, conv_state, x_rows):  # type: ignore[no-untyped-def]
        return gated_delta.conv_state_after(conv_state, x_rows)


def _attention_rows(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: Any
) -> np.ndarray:
    """softmax(scale q k^T, mask) v in float32 with GQA: q [Hq, L, D], k/v [Hkv, S, D]."""
    Hq, L, D = q.shape
    Hkv, S, _ = k.shape
    G = Hq // Hkv
    qg = q.reshape(Hkv, G * L, D)  # the G query heads sharing a kv head, stacked
    scores = (qg @ k.transpose(0, 2, 1)).reshape(Hkv, G, L, S) * F32(scale)
    if mask is not None:
        scores = np.where(mask, scores, F32(-np.inf))
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    out = scores.reshape(Hkv, G * L, S) @ v  # [Hkv, G*L, D]
    return out.reshape(Hq, L, D)
