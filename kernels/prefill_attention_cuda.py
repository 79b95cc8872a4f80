"""A prefill chunk's causal attention as one CUDA kernel (MLX's `mx.fast.cuda_kernel`).

MLX's CUDA attention hands more than one query row in half precision to cuDNN, which
builds a graph for every new (rows, keys) pair: 40-60 ms on an H100, where the default
model's whole forward of 512 rows takes ~10 ms, and a chat meets a new pair nearly every
turn. `kernels/few_query_attention.py`'s matmuls pay no build but ~12 small kernels a
layer and a [heads, rows, keys] score matrix (a forward of 2,048 rows 30 ms against
cuDNN's 14; docs/BENCHMARKS.md, "A new prompt length on CUDA"). This kernel reads the
row and key counts from its inputs' shapes, so one build per head size and group serves
every length, in one launch a layer, holding no score matrix
(`kernels/cuda/prefill_attention.cu`: tiles of keys in shared memory, the online
softmax). Causal masks only (a sliding window's keys sit in a ring, out of order): the
rest keep the matmuls. Only built where MLX runs on CUDA. On an H100 (session 33) its
rows matched cuDNN's and a first call at a new length cost 0.23 ms, but it works in scalar
float32: one call of 2,000 rows took 1.04 ms against cuDNN's 0.17 and the matmuls' 0.76
(`bench/gpu/prefill_split.py`). So `ENABLED` stays off; a tensor-core form would pay.
That form is `kernels/cuda/prefill_attention_mma.cu` (FlashAttention-2's tiling on
`mma.sync`), taken for bfloat16 / float16 K/V of head size 64 or 128 (`TENSOR_CORES`);
float32 and head size 256 keep the scalar body. Not yet run on a GPU.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import mlx.core as mx

from kernels import cuda

ENABLED = False
THREADS = 128  # 4 warps of 4 rows: 16 rows a block
ROWS_A_BLOCK = 16
_KEYS_A_TILE = {64: 32, 128: 16, 256: 8}  # head size -> keys a tile (64 features a lane)
# half-precision K/V of these head sizes take the tensor-core body: 4 warps of 16 rows
TENSOR_CORES = True
MMA_HEADS = (64, 128)
MMA_ROWS_A_BLOCK = 64

is_available = cuda.is_available


def takes(q: mx.array, k: mx.array) -> bool:
    """Whether the kernel serves q [1, H, L, D] over k [1, KVH, S, D] causally: a head
    size it is built for, whole groups, and at least as many keys as rows."""
    D, H, KVH = int(q.shape[-1]), int(q.shape[1]), int(k.shape[1])
    return D in _KEYS_A_TILE and H % KVH == 0 and int(k.shape[2]) >= int(q.shape[2])


def on_tensor_cores(k: mx.array) -> bool:
    """Whether K/V like `k` take the tensor-core body (TENSOR_CORES, a half dtype, a head
    size it is built for)."""
    return TENSOR_CORES and k.dtype in (mx.bfloat16, mx.float16) and int(k.shape[-1]) in MMA_HEADS


@cache
def _kernel(mma: bool = False) -> Any:
    name = "prefill_attention_mma" if mma else "prefill_attention"
    return mx.fast.cuda_kernel(
        name=name,
        input_names=["q", "k", "v", "scale"],
        output_names=["out"],
        source=cuda.source(f"{name}.cu"),
        header=cuda.source("prefill_attention_mma.cuh") if mma else "",
    )


def prefill_attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, tensor_cores: bool = True
) -> mx.array:
    """softmax(q k^T * scale, causal, aligned to the last key) v for q [1, H, L, D] and
    k, v [1, KVH, S, D] (query head h reads key head h // (H / KVH)); [1, H, L, D] in k's
    dtype. Scores, softmax and sums in float32; on tensor cores the softmax's weights are
    rounded to k's dtype before they meet V, as FlashAttention's and cuDNN's are.
    `tensor_cores=False` takes the scalar body whatever K/V are."""
    if not takes(q, k):
        raise ValueError(
            f"prefill attention takes head sizes {sorted(_KEYS_A_TILE)}, whole groups and "
            f"no more rows than keys, not q {tuple(q.shape)} over k {tuple(k.shape)}"
        )
    _, H, L, D = (int(d) for d in q.shape)
    KVH = int(k.shape[1])
    inputs = [q.astype(k.dtype), k, v, mx.array([scale], dtype=mx.float32)]
    if tensor_cores and on_tensor_cores(k):
        (out,) = _kernel(mma=True)(
            inputs=inputs,
            template=[("T", k.dtype), ("D", D), ("G", H // KVH)],
            grid=(-(-L // MMA_ROWS_A_BLOCK) * THREADS, H, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(1, H, L, D)],
            output_dtypes=[k.dtype],
        )
        return out
    (out,) = _kernel()(
        inputs=inputs,
        template=[("T", k.dtype), ("D", D), ("BK", _KEYS_A_TILE[D]), ("G", H // KVH)],
        grid=(-(-L // ROWS_A_BLOCK) * THREADS, H, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(1, H, L, D)],
        output_dtypes=[k.dtype],
    )
    return out
