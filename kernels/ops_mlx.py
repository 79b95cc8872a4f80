"""The MLX backend: the GPU path (Metal or CUDA) and the plain reference path on a CPU.

Quantized weights stay packed and go through `mx.quantized_matmul` (a fused projection
whose parts are quantized differently as `kernels.row_parts.RowParts`, one matmul a part);
weights and KV rows are float16/bfloat16 on a GPU and float32 on the CPU (float16 is ~40x
slower there); activations (the residual stream, norms, products' outputs) are float32.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np

from kernels import few_query_attention, gated_delta_cuda, gated_delta_mlx, quantized
from kernels.masks import CausalMask, WindowMask
from kernels.quantized import QuantizedWeight
from kernels.row_parts import RowParts, join_runs

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
# How a GPU multiplies WIDE_ROWS or more rows of x (a prefill chunk) by a quantized weight:
# "quantized" (MLX's quantized_matmul), "dense32" (the weight dequantized to float32, one
# float32 GEMM), "dense16" (rows and weight in the compute dtype) or "quantized16" (MLX's
# quantized_matmul on the rows rounded to the compute dtype, the product back in float32).
# quantized16 is the default: on the H200 46k against quantized's 33k tok/s at 512 tokens,
# 135k against 63k at 2,048, top-1 against float64 0.969 (llama.cpp on the CPU: 0.964);
# every figure: docs/BENCHMARKS.md, "Prefill rows in bfloat16", and docs/h200/prefill-probe-*.
WIDE_MATMULS = ("quantized", "dense32", "dense16", "quantized16")
DEFAULT_WIDE_MATMUL = "quantized16"
WIDE_ROWS = 64
# Whether a forward hands each layer's output to the GPU as soon as it is built
# (`MlxOps.start`), so the device runs layer i while Python builds layer i + 1. Off: on the
# H200 it gained 20-25% at 2,048 rows and lost 10-20% at 1 to 1,024 (a 512-token prefill
# 46k -> 42k tok/s; docs/h200/forward-probe-quantized16-20261202-s11.json).
OVERLAP_LAYERS = False


def _gelu_tanh(x: mx.array) -> mx.array:
    """GELU's tanh approximation (Hendrycks & Gimpel 2016), PyTorch's approximate="tanh"."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + mx.tanh(inner))


def _packed_kind(w: Any) -> tuple[int, int] | None:
    """Which neighbours a part joins into one quantized matrix; dense parts keep their own
    matmul (a wider dense matmul need not give a column the same value)."""
    return (w.group_size, w.bits) if isinstance(w, QuantizedWeight) else None


def _concat_quantized(ws: list[QuantizedWeight]) -> QuantizedWeight:
    first = ws[0]
    return QuantizedWeight(
        mx.concatenate([w.packed for w in ws]),
        mx.concatenate([w.scales for w in ws]),
        mx.concatenate([w.biases for w in ws]),
        first.group_size,
        first.bits,
    )


def default_dtype() -> Any:
    return mx.float32 if mx.default_device() == mx.cpu else mx.bfloat16


class MlxOps:
    name = "mlx"

    def __init__(
        self,
        dtype: str | None = None,
        wide_matmul: str | None = None,
        overlap_layers: bool | None = None,
        gdn_prefill: str | None = None,
    ) -> None:
        if dtype is not None and dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, not {dtype!r}")
        if wide_matmul is not None and wide_matmul not in WIDE_MATMULS:
            raise ValueError(f"wide_matmul must be one of {WIDE_MATMULS}, not {wide_matmul!r}")
        self.dtype = _DTYPES[dtype] if dtype else default_dtype()
        # weights and state (KV rows, conv windows) in `dtype`, activations in float32 from
        # the embedding on (products promote to it), as in the fused step: bfloat16
        # activations were most of the H200's distance from float64 (BENCHMARKS.md)
        self.act_dtype = mx.float32
        self.kv_dtype = self.dtype  # K/V rows in the compute dtype (make_ops refuses others)
        self._cuda_recurrent = gated_delta_cuda.is_available()
        if gdn_prefill not in (None, "chunked", "recurrent"):
            raise ValueError(f"gdn_prefill must be 'chunked' or 'recurrent', not {gdn_prefill!r}")
        if gdn_prefill == "recurrent" and not self._cuda_recurrent:
            raise ValueError(
                "gdn_prefill 'recurrent' (BRANCHCHAT_GDN_PREFILL) runs the CUDA recurrence: "
                "it needs MLX on a CUDA GPU"
            )
        # a prefill's Gated DeltaNet rows: the CUDA kernel where there is one (1.1-2.8x)
        self.gdn_prefill = gdn_prefill or ("recurrent" if self._cuda_recurrent else "chunked")
        self._gpu = mx.default_device() == mx.gpu
        self._cuda = self._gpu and not mx.metal.is_available()
        self._freqs_cache: dict[bytes, mx.array] = {}
        # (logits, their argmax rows) evaluated together by their producer (`remember_argmax`)
        self._argmax: tuple[mx.array, mx.array] | None = None
        self._window: tuple[WindowMask, mx.array] | None = None  # the last sliding mask
        self.wide_matmul = wide_matmul or DEFAULT_WIDE_MATMUL
        # asked for, it is done on any device (MLX's CPU evaluates asynchronously too)
        default = self._gpu and OVERLAP_LAYERS
        self.overlap_layers = default if overlap_layers is None else overlap_layers
        # On CUDA, each weight as the loader stored it (float32 scales and biases, groups of
        # 16 still quantized) beside the one computed with, by the latter's id, until the
        # one-launch step has read them into its table (`stored`, `forget_stored`)
        self._stored: dict[int, tuple[Any, Any]] | None = {} if self._cuda else None

    # -- weights -------------------------------------------------------------------
    def weight(self, w: Any) -> Any:
        if isinstance(w, QuantizedWeight) and not w.is_mlx_exact:
            # MLX has no groups of 16 (GGUF's Q2_K, Q3_K, Q6_K): a dense matrix instead
            return self._keep(mx.array(quantized.dequantize(w)).astype(self.dtype), w)
        if isinstance(w, QuantizedWeight):
            scales, biases = w.scales.astype(self.dtype), w.biases.astype(self.dtype)
            return self._keep(replace(w, scales=scales, biases=biases), w)
        return self._keep(self.asarray(w), w)

    def compact_weight(self, w: Any) -> Any:
        """`weight`: the dtype already rounds what a drafter's reader tolerates."""
        return self.weight(w)

    def _keep(self, ours: Any, stored: Any) -> Any:
        if self._stored is not None:
            if isinstance(stored, np.ndarray):
                stored = mx.array(stored)
            self._stored[id(ours)] = (ours, stored)  # `ours` held: its id stays its own
        return ours

    def stored(self, w: Any) -> Any:
        """`w` (from `weight` or `concat_weights`) as the loader stored it, where kept (on
        CUDA, until `forget_stored`); else `w` itself."""
        entry = self._stored.get(id(w)) if self._stored else None
        return entry[1] if entry is not None else w

    def forget_stored(self) -> None:
        """Drop the stored copies (the step's table holds what it needs)."""
        if self._stored is not None:
            self._stored.clear()

    def norm_weight(self, w: Any) -> mx.array:
        return self.asarray(w)

    def concat_weights(self, ws: list[Any]) -> Any:
        """`weight`s' rows in one weight (a fused projection)."""
        stored = [self.stored(w) for w in ws]
        rows = tuple(int(w.shape[0]) for w in ws)
        as_stored = RowParts(tuple(stored), rows, int(ws[0].shape[1])) if len(ws) > 1 else stored[0]
        if not any(isinstance(w, QuantizedWeight) for w in ws):  # all dense [out, in]
            return self._keep(mx.concatenate(ws), as_stored)
        parts = join_runs(ws, _packed_kind, _concat_quantized)
        if len(parts) == 1:
            return self._keep(parts[0], as_stored)
        # parts quantized differently (Gemma 3's 5-bit q|k and 8-bit v) stay quantized, each
        # its own matmul; a dense copy would read 3-6x the bytes per decode step
        part_rows = tuple(int(p.shape[0]) for p in parts)
        return self._keep(RowParts(tuple(parts), part_rows, int(parts[0].shape[1])), as_stored)

    def _dense(self, w: Any) -> mx.array:
        """A weight from `weight` or `concat_weights` as one dense [out, in] matrix."""
        if isinstance(w, RowParts):
            return mx.concatenate([self._dense(p) for p in w.parts])
        if isinstance(w, QuantizedWeight):
            return mx.dequantize(
                w.packed, w.scales, w.biases, group_size=w.group_size, bits=w.bits
            ).astype(self.dtype)
        return w

    # -- arrays --------------------------------------------------------------------
    def asarray(self, x: Any) -> mx.array:
        if isinstance(x, np.ndarray):
            return mx.array(x.astype(np.float32)).astype(self.dtype)
        return x.astype(self.dtype)

    def to_numpy(self, x: mx.array) -> np.ndarray:
        return np.array(x.astype(mx.float32), dtype=np.float32)

    def argmax_rows(self, x: mx.array) -> np.ndarray:
        kept = self._argmax
        if kept is not None and kept[0] is x:  # the same array: the same values, one read
            return np.array(kept[1])
        return np.array(mx.argmax(x, axis=-1))

    def top1_rows(self, x: mx.array) -> tuple[np.ndarray, np.ndarray]:
        x = x.astype(mx.float32)
        top = mx.argmax(x, axis=-1)
        peak = mx.take_along_axis(x, top[:, None], axis=-1)
        probability = 1.0 / mx.exp(x - peak).sum(axis=-1)
        mx.eval(top, probability)  # one wait for the device, k ids and k floats read back
        return np.array(top), np.array(probability, dtype=np.float32)

    def remember_argmax(self, logits: mx.array, top: mx.array) -> None:
        """`top` = argmax(logits, axis=-1), evaluated with `logits` by their producer (the
        fused step: in the launch's own evaluation), so a greedy read of these logits
        takes `top` instead of a second launch and a second wait for the device."""
        self._argmax = (logits, top)

    def linear(self, x: mx.array, w: Any) -> mx.array:
        if isinstance(w, RowParts):  # each part's columns of x @ W^T, side by side
            return mx.concatenate([self.linear(x, p) for p in w.parts], axis=-1)
        if isinstance(w, QuantizedWeight) and self._bad_cuda_qmm(x, w):
            return x @ self._dense(w).T
        if isinstance(w, QuantizedWeight) and self._wide(x):
            return self._wide_product(x, w)
        if isinstance(w, QuantizedWeight):
            return self._quantized_product(x, w)
        return x @ w.T

    def _quantized_product(self, x: mx.array, w: QuantizedWeight) -> mx.array:
        return mx.quantized_matmul(
            x, w.packed, w.scales, w.biases, transpose=True, group_size=w.group_size, bits=w.bits
        )

    def _bad_cuda_qmm(self, x: mx.array, w: QuantizedWeight) -> bool:
        """More than one row of x (CUDA's matrix kernel) against rows it gets wrong.

        MLX 0.32.4's CUDA kernel for several rows of x gets a weight row of a single group
        wrong (max error 4.1 on products of 2.3 for rows of one group of 64, 30-40 s a
        call; rows of two groups came out right: tools/gpu/qmm_probe.py on the H200).
        Real models' rows are hundreds of groups long; a tiny test model's can be one."""
        return self._cuda and w.shape[1] <= w.group_size and x.size > x.shape[-1]

    def _wide(self, x: mx.array) -> bool:
        return self.wide_matmul != "quantized" and self._gpu and x.size >= WIDE_ROWS * x.shape[-1]

    def _wide_product(self, x: mx.array, w: QuantizedWeight) -> mx.array:
        if self.wide_matmul == "dense16":
            return (x.astype(self.dtype) @ self._dense(w).T).astype(x.dtype)
        if self.wide_matmul == "quantized16":
            return self._quantized_product(x.astype(self.dtype), w).astype(x.dtype)
        dense = mx.dequantize(  # the same s * q + b as quantized_matmul's, in float32
            w.packed,
            w.scales.astype(mx.float32),
            w.biases.astype(mx.float32),
            group_size=w.group_size,
            bits=w.bits,
        )
        return x @ dense.T

    def embed(self, table: Any, ids: np.ndarray) -> mx.array:
        return self._embed(table, ids).astype(self.act_dtype)

    def _embed(self, table: Any, ids: np.ndarray) -> mx.array:
        if isinstance(table, RowParts):
            return self._embed_parts(table, np.array(ids))
        idx = ids if isinstance(ids, mx.array) else mx.array(ids.astype(np.int32))
        if isinstance(table, QuantizedWeight):
            return mx.dequantize(
                table.packed[idx],
                table.scales[idx],
                table.biases[idx],
                group_size=table.group_size,
                bits=table.bits,
            ).astype(self.dtype)
        return table[idx]

    def _embed_parts(self, table: RowParts, ids: np.ndarray) -> mx.array:
        """Each part's rows, gathered part by part, then put back in the order of ids."""
        found = table.locate(ids)
        if not found:
            return mx.zeros((0, table.shape[1]), dtype=self.dtype)
        rows = mx.concatenate([self._embed(part, local) for part, _, local in found])
        order = np.argsort(np.concatenate([positions for _, positions, _ in found]))
        return rows[mx.array(order.astype(np.int32))]

    def rms_norm(self, x: mx.array, w: mx.array | None, eps: float) -> mx.array:
        return mx.fast.rms_norm(x, w, eps)

    def rope(
        self,
        x: mx.array,
        offset: int,
        dims: int,
        base: float,
        traditional: bool,
        inv_freq: np.ndarray | None = None,
        mscale: float = 1.0,
    ) -> Any:
        if mscale != 1.0:  # HF multiplies cos and sin: the rotated features only (rope is linear)
            scaled = x[..., :dims] * mscale
            x = scaled if dims == x.shape[-1] else mx.concatenate([scaled, x[..., dims:]], -1)
        if inv_freq is None:
            return mx.fast.rope(
                x, dims, traditional=traditional, base=base, scale=1.0, offset=offset
            )
        return mx.fast.rope(
            x,
            dims,
            traditional=traditional,
            base=None,
            scale=1.0,
            offset=offset,
            freqs=self._wavelengths(inv_freq),
        )

    def _wavelengths(self, inv_freq: np.ndarray) -> mx.array:
        """mx.fast.rope's `freqs` are 1 / inv_freq (angle = position / freq); cached per table."""
        key = inv_freq.tobytes()
        cached = self._freqs_cache.get(key)
        if cached is None:
            cached = mx.array((1.0 / np.asarray(inv_freq, np.float64)).astype(np.float32))
            self._freqs_cache[key] = cached
        return cached

    def attention(self, q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any) -> Any:
        if isinstance(mask, CausalMask):  # aligned to the last key, as CausalMask is
            m: Any = "causal"
        elif isinstance(mask, WindowMask):
            m = self._window_mask(mask)
        else:
            m = mask if mask is None or isinstance(mask, mx.array) else mx.array(mask)
        # in the cache's dtype: a float32 query would promote the whole cache every step
        q, k, v = q.astype(k.dtype)[None], k[None], v[None]
        if self._cuda and few_query_attention.takes(q, k, m):  # no cuDNN graph build a shape
            return few_query_attention.attend(q, k, v, scale, m)[0]
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=m)[0]

    def _window_mask(self, mask: WindowMask) -> mx.array:
        """`mask` built on the device, once for the forward's sliding layers (their masks
        are equal: the last one is kept)."""
        kept = self._window
        if kept is None or kept[0] != mask:
            keys = mx.array(mask.key_positions())[None, :]
            queries = mx.arange(mask.start, mask.start + mask.rows)[:, None]
            built = (keys <= queries) & (keys >= 0)
            if mask.window:
                built = built & (keys > queries - mask.window)
            kept = self._window = (mask, built)
        return kept[1]

    def silu(self, x: mx.array) -> mx.array:
        return x * mx.sigmoid(x)

    def gelu_tanh(self, x: mx.array) -> mx.array:
        return _gelu_tanh(x)

    def sigmoid(self, x: mx.array) -> mx.array:
        return mx.sigmoid(x)

    def softplus(self, x: mx.array) -> mx.array:
        return mx.logaddexp(mx.zeros_like(x), x)

    def exp(self, x: mx.array) -> mx.array:
        return mx.exp(x)

    def concat(self, xs: list[mx.array], axis: int) -> mx.array:
        return mx.concatenate(xs, axis=axis)

    def split(self, x: mx.array, sizes: list[int], axis: int) -> list[mx.array]:
        return list(mx.split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis))

    def zeros(self, shape: tuple[int, ...], dtype: Any = None) -> mx.array:
        return mx.zeros(shape, dtype=dtype or self.dtype)

    def write_rows(self, buf: mx.array, start: int, rows: mx.array) -> mx.array:
        buf[:, start : start + rows.shape[1]] = rows
        return buf

    def snapshot(self, x: mx.array) -> mx.array:
        # An independent, evaluated buffer: the fused CUDA step writes new KV rows into
        # the live buffers in place, so a lazy copy or a view of them would change.
        y = x + mx.array(0, dtype=x.dtype)
        mx.eval(y)
        return y

    def nbytes(self, x: mx.array) -> int:
        return int(x.nbytes)

    def evaluate(self, *xs: Any) -> None:
        mx.eval(*xs)

    def start(self, *xs: Any) -> None:
        """On a GPU with `overlap_layers`, the device computes xs while Python builds the
        graph of what follows (a forward's next layer); the values are the same either way."""
        if self.overlap_layers:
            mx.async_eval(*xs)

    # -- recurrent kernels -----------------------------------------------------------
    def gated_delta_recurrent(self, q, k, v, g, beta, state):  # type: ignore[no-untyped-def]
        if self._cuda_recurrent:  # one launch for all rows instead of ~6 per row
            return gated_delta_cuda.gated_delta_recurrent(q, k, v, g, beta, state)
        return gated_delta_mlx.gated_delta_recurrent(q, k, v, g, beta, state)

    def gated_delta_chunked(self, q, k, v, g, beta, state):  # type: ignore[no-untyped-def]
        if self.gdn_prefill == "recurrent":  # one launch, row by row (checked: on CUDA)
            return gated_delta_cuda.gated_delta_prefill(q, k, v, g, beta, state)
        return gated_delta_mlx.gated_delta_chunked(q, k, v, g, beta, state)

    def causal_conv1d(self, x, weight, conv_state):  # type: ignore[no-untyped-def]
        # the conv window is state, kept in the compute dtype (saved, reloaded, replayed
        # by conv_state_after in it): its input rows are rounded to it first, so a row
        # reads the same window whichever forward brought its neighbours
        return gated_delta_mlx.causal_conv1d(x.astype(conv_state.dtype), weight, conv_state)

    def conv_state_after(self, conv_state, x_rows):  # type: ignore[no-untyped-def]
        return gated_delta_mlx.conv_state_after(conv_state, x_rows)
