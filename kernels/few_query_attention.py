"""Attention of more than one query row as plain MLX matmuls, for the CUDA backend: a
verify, a block drafter's pass, and a prefill chunk whose scores fit MAX_SCORES.

MLX's CUDA `scaled_dot_product_attention` takes more than one query row in half precision
through cuDNN, which builds a graph for every (query rows, key rows, strides) it meets and
keeps the last 256. A draft pass or a verify meets a new key count every round, so every
round paid a graph build: on the H200 the block drafter's requests ran at 15-280 tok/s
against plain decoding's 770 while its pass at one fixed context took 1.7 ms
(docs/BENCHMARKS.md, "The block drafter on the H200"). A prompt meets a new (rows, keys)
pair nearly every time too: on an H100 a build cost 47-68 ms an attention shape (a masked
one up to 0.9 s), where the default model's whole forward of 512 rows takes 9-16 ms
("A new prompt length on CUDA", docs/BENCHMARKS.md). Matmuls take any shape with no build.
Scores, softmax and the weighted sum are float32; the result comes back in the caches'
dtype, as the fused kernel's does.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import mlx.core as mx

from kernels import prefill_attention_cuda

# Up to this many query rows take the matmuls whatever the keys: a verify of MAX_DRAFT + 1
# rows and a block pass fit.
FEW_QUERY_ROWS = 32
# More rows take them while the float32 scores of all heads, [H, rows, keys], hold at most
# this many (256 MiB; the softmax's passes hold two or three such at once). Beyond it a
# chunk keeps cuDNN's flash kernel, which holds no score matrix and pays a build a shape.
MAX_SCORES = 1 << 26


def _kernel_takes(q: mx.array, k: mx.array, mask: Any) -> bool:
    """A chunk of more than FEW_QUERY_ROWS causal rows, where the one-launch prefill
    attention is on (`kernels.prefill_attention_cuda.ENABLED`) and its tensor-core body
    takes the shape and dtype (the scalar body, 6x cuDNN's time at 2,000 rows on an H100,
    is never the engine's choice)."""
    return (
        prefill_attention_cuda.ENABLED
        and int(q.shape[2]) > FEW_QUERY_ROWS
        and isinstance(mask, str)
        and prefill_attention_cuda.takes(q, k)
        and prefill_attention_cuda.on_tensor_cores(k)
    )


def takes(q: mx.array, k: mx.array, mask: Any) -> bool:
    """Whether `attend` serves q [1, H, L, Dh] over k [1, KVH, S, Dh] with `mask`
    ("causal", None or a bool or additive [L, S] array): more than one row, and at most
    FEW_QUERY_ROWS of them, or scores of at most MAX_SCORES, or a chunk the one-launch
    prefill attention takes."""
    H, L, S = int(q.shape[1]), int(q.shape[2]), int(k.shape[2])
    if _kernel_takes(q, k, mask):
        return True
    if L <= 1 or (L > FEW_QUERY_ROWS and H * L * S > MAX_SCORES):
        return False
    return mask is None or isinstance(mask, str) or mask.ndim == 2


def attend(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any) -> mx.array:
    """What `takes` promised: the one-launch prefill attention where it takes the rows,
    else `few_query_attention`'s matmuls."""
    if _kernel_takes(q, k, mask):
        if mask != "causal":
            raise ValueError(f"unknown mask {mask!r}")
        return prefill_attention_cuda.prefill_attention(q, k, v, scale)
    return few_query_attention(q, k, v, scale, mask)


@lru_cache(maxsize=1)
def causal_mask(rows: int, keys: int) -> mx.array:
    """[rows, keys] bool, True where a row reads a key (aligned to the last key); kept for
    the forward's other layers, which ask for the same one."""
    return mx.arange(keys)[None, :] <= mx.arange(keys - rows, keys)[:, None]


@lru_cache(maxsize=1)
def causal_bias(group: int, rows: int, keys: int) -> mx.array:
    """[group * rows, keys] float32: 0 where a row reads a key and -inf elsewhere, the
    causal rows once for each query head of a key head's group (the scores' row order).
    One is kept, a forward's (its layers share it): at most 4 * MAX_SCORES / key heads
    bytes, 89 MB for the default model's largest chunk that takes the matmuls."""
    bias = mx.where(causal_mask(rows, keys), 0.0, -mx.inf).astype(mx.float32)
    return mx.tile(bias, (group, 1))


def few_query_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any) -> mx.array:
    """softmax(q k^T * scale + mask) v for q [1, H, L, Dh] and k, v [1, KVH, S, Dh], query
    head h reading key head h // (H / KVH); mask "causal" (aligned to the last key), None,
    or an [L, S] array (bool: True reads; else added to the scores). [1, H, L, Dh].

    A key head's group of query heads is one matrix of group * L rows, so each product
    reads the keys and values as stored, with no copy broadcast over the group; a causal
    mask is a bias the product adds as it scales (`mx.addmm`), built once for a forward's
    layers: seven operations a layer where there were about twelve (on an H100 those
    twelve cost a 128-row forward of the default model 17.7 ms warm against cuDNN's 8.2)."""
    _, H, L, Dh = (int(d) for d in q.shape)
    KVH, S = int(k.shape[1]), int(k.shape[2])
    group = H // KVH
    queries = q[0].astype(mx.float32).reshape(KVH, group * L, Dh)
    keys, values = k[0].astype(mx.float32), v[0].astype(mx.float32)  # [KVH, S, Dh]
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown mask {mask!r}")
        bias = causal_bias(group, L, S)
        scores = mx.addmm(bias, queries, keys.swapaxes(-1, -2), alpha=scale)
    else:
        scores = ((queries * scale) @ keys.swapaxes(-1, -2)).reshape(KVH, group, L, S)
        if mask is not None and mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.array(-mx.inf, dtype=mx.float32))
        elif mask is not None:
            scores = scores + mask.astype(mx.float32)
        scores = scores.reshape(KVH, group * L, S)
    weights = mx.softmax(scores, axis=-1, precise=True)
    return (weights @ values).reshape(1, H, L, Dh).astype(k.dtype)
