"""The op set the models are written against, and how a backend is chosen.

Two backends implement it: `NumpyOps` (the CPU fast path: quantized weights stay packed
and go through a C kernel for decode-sized rows, larger batches and float weights
through NumPy's BLAS, every other op in NumPy, no per-op scheduling cost) and `MlxOps`
(MLX on its GPU, or on the CPU as the plain reference path). Model code is written once
against this interface; arrays are opaque to it.

Pure-function rule: no op mutates an input array, except `write_rows`, which the
attention KV cache uses on buffers nothing else references. Recurrent states are
therefore snapshotted by keeping a reference.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from kernels.masks import CausalMask
from kernels.quantized import QuantizedWeight

# QuantizedWeight is what `Ops.weight` takes and CausalMask what `Ops.attention` may, so
# model code imports them with the op set
__all__ = ["Array", "CausalMask", "Ops", "QuantizedWeight", "default_backend", "make_ops"]

Array = Any  # np.ndarray or mx.array, depending on the backend


class Ops(Protocol):
    name: str
    dtype: Any
    kv_dtype: Any  # what attention K/V rows are stored in (`zeros(shape, kv_dtype)`)

    def weight(self, w: Any) -> Any: ...
    def compact_weight(self, w: Any) -> Any:
        """A float matrix for a reader that tolerates rounding (a drafter's), stored as
        this backend reads fastest."""
        ...

    def norm_weight(self, w: Any) -> Any: ...
    def concat_weights(self, ws: list[Any]) -> Any: ...
    def asarray(self, x: Any) -> Array: ...
    def to_numpy(self, x: Array) -> np.ndarray: ...
    def argmax_rows(self, x: Array) -> np.ndarray: ...
    def top1_rows(self, x: Array) -> tuple[np.ndarray, np.ndarray]:
        """Per row of logits [k, N]: the argmax and its softmax probability (float32),
        read back together; a greedy draft needs no more of the rows."""
        ...

    def linear(self, x: Array, w: Any) -> Array: ...
    def embed(self, table: Any, ids: np.ndarray) -> Array: ...
    def rms_norm(self, x: Array, w: Array | None, eps: float) -> Array: ...
    def rope(
        self,
        x: Array,
        offset: int,
        dims: int,
        base: float,
        traditional: bool,
        inv_freq: np.ndarray | None = None,
        mscale: float = 1.0,
    ) -> Array:
        """Rotate the first `dims` features of each head [H, L, Dh] at positions offset..;
        `inv_freq` [dims/2] replaces base ** (-2i / dims) (scaled ropes), and `mscale`
        multiplies the rotated features (YaRN's attention factor on cos and sin)."""
        ...

    def attention(self, q: Array, k: Array, v: Array, scale: float, mask: Any) -> Array:
        """softmax(scale q k^T) v over [H, L, Dh] heads (GQA); mask: None (every key), a
        CausalMask, or bool [L, S] (True = attend)."""
        ...

    def silu(self, x: Array) -> Array: ...
    def gelu_tanh(self, x: Array) -> Array: ...
    def sigmoid(self, x: Array) -> Array: ...
    def softplus(self, x: Array) -> Array: ...
    def exp(self, x: Array) -> Array: ...
    def concat(self, xs: list[Array], axis: int) -> Array: ...
    def split(self, x: Array, sizes: list[int], axis: int) -> list[Array]: ...
    def zeros(self, shape: tuple[int, ...], dtype: Any = None) -> Array: ...
    def write_rows(self, buf: Array, start: int, rows: Array) -> Array: ...
    def snapshot(self, x: Array) -> Array: ...
    def nbytes(self, x: Array) -> int: ...
    def evaluate(self, *xs: Any) -> None: ...
    def start(self, *xs: Any) -> None: ...  # begin computing xs, not waiting for them
    def gated_delta_recurrent(self, q, k, v, g, beta, state) -> tuple[Array, Array]: ...
    def gated_delta_chunked(self, q, k, v, g, beta, state) -> tuple[Array, Array]: ...
    def causal_conv1d(self, x, weight, conv_state) -> tuple[Array, Array]: ...
    def conv_state_after(self, conv_state, x_rows) -> Array: ...


def default_backend() -> str:
    """`numpy` when MLX's default device is the CPU (it is ~10x slower there), else `mlx`."""
    import mlx.core as mx

    return "numpy" if mx.default_device() == mx.cpu else "mlx"


def make_ops(
    backend: str | None = None,
    dtype: str | None = None,
    *,
    qmatmul: bool | None = None,
    cpu_matmul: str | None = None,
    kv_dtype: str | None = None,
    gpu_matmul: str | None = None,
    gpu_overlap: bool | None = None,
    gdn_prefill: str | None = None,
) -> Ops:
    """The op set for `backend` (None: by MLX's default device, see `default_backend`).

    dtype: the MLX compute dtype (None: the backend's default; float32 on a GPU makes
    greedy speculation bit-stable for comparisons); the numpy backend computes in float32.
    qmatmul: whether the numpy backend keeps quantized weights packed for the C kernel
    (None: where a SIMD path was built; see `kernels.qmatmul.enabled`); cpu_matmul how
    that kernel multiplies, "int8" or "float" (None: "int8" where an int8 SIMD path runs;
    see `kernels.ops_numpy.NumpyOps`).
    kv_dtype: what the numpy backend stores K/V rows in ("float16" or "float32"; None:
    float16). MLX keeps them in its compute dtype and refuses any other.
    gpu_matmul: how the MLX backend multiplies a prefill's rows by a quantized weight on a
    GPU (`kernels.ops_mlx.WIDE_MATMULS`; None: its default); gpu_overlap whether a GPU
    forward starts each layer's rows as they are built (None: `OVERLAP_LAYERS`);
    gdn_prefill how a prefill chunk runs the Gated DeltaNet recurrence, "chunked" or
    "recurrent" (the CUDA kernel: refused where MLX has no CUDA GPU); None: "recurrent"
    where MLX runs on CUDA, else "chunked".
    """
    backend = backend or default_backend()
    if backend == "numpy":
        from kernels.ops_numpy import NumpyOps

        return NumpyOps(packed=qmatmul, cpu_matmul=cpu_matmul, kv_dtype=kv_dtype)
    if backend == "mlx":
        from kernels.ops_mlx import MlxOps

        ops = MlxOps(
            dtype or None,
            wide_matmul=gpu_matmul,
            overlap_layers=gpu_overlap,
            gdn_prefill=gdn_prefill,
        )
        computes_in = str(ops.dtype).rsplit(".", 1)[-1]
        if kv_dtype is not None and kv_dtype != computes_in:
            raise ValueError(
                f"the MLX backend keeps K/V rows in its compute dtype ({computes_in}); "
                f"kv_dtype={kv_dtype!r} needs dtype={kv_dtype!r} there"
            )
        return ops
    raise ValueError(f"unknown backend {backend!r}; expected 'numpy' or 'mlx'")
