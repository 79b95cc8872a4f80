"""A nucleus draw's pack and the device's draw from it as one CUDA kernel (MLX's
`mx.fast.cuda_kernel`; the body is kernels/cuda/nucleus_pack.cu).

A queued sampled step on a GPU (engine/runner/ahead.py) packs its logits row for the
host's draw (engine/device_sampling.py's `pack`: the K likeliest logits, their ids, the
other tokens' float32 weight) and draws the next step's token from that pack
(`_token_among`). As MLX operations that is an argpartition of the vocabulary and a dozen
small kernels, each launched from the host: on an H200 their launch was 354 µs of a
1,155 µs sampled step, where a greedy step took 757 (docs/BENCHMARKS.md). Here both are
one launch, one block a row.

The pack it writes is one the host's draw takes as it takes `pack`'s: the same K largest
logits and ids in another order, and the other tokens' weight summed in another order,
which engine/sampling_candidates.py's bound allows for (any order of adding V terms).
Ties at the K-th logit are the one place the two may pick different tokens; the count
then says more than K, and the host's draw reads the whole row either way. Its token is
`_token_among`'s but for float32 sums taken in another order: like that draw, a guess the
host checks. Only built where MLX runs on CUDA.
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Any

import mlx.core as mx

from kernels import cuda

THREADS = 1024  # a block a row: 48 logits a thread over the default model's vocabulary


is_available = cuda.is_available  # where MLX's default device is a CUDA GPU


@cache
def _kernel() -> Any:
    return mx.fast.cuda_kernel(
        name="nucleus_pack",
        input_names=["rows", "settings", "u"],
        output_names=["packed", "token"],
        source=cuda.source("nucleus_pack.cu"),
        header=cuda.source("nucleus_pack.cuh"),
    )


@lru_cache(maxsize=16)
def _settings(temperature: float, top_p: float) -> mx.array:
    """A request's [temperature, top_p], made once. MLX's CUDA allocator keeps every
    buffer in managed memory and takes arrays of 8 bytes or fewer from a small pool whose
    pages are advised read-mostly (mlx/backend/cuda/allocator.cpp). The three floats as one
    12-byte array the host wrote each step were a page the device faulted in and the host
    faulted back every step; now the settings are written once and the step's uniform
    (4 bytes) alone each step. (Reasoned from the allocator; not yet timed on a GPU.)"""
    settings = mx.array([temperature, top_p], dtype=mx.float32)
    mx.eval(settings)
    return settings


def pack_and_draw(
    rows: mx.array, k: int, temperature: float, top_p: float, u: float
) -> tuple[mx.array, mx.array]:
    """(packs [n, 2k + 3] float32, tokens [n] uint32) of logits rows [n, V] float32, V > k,
    the draw at uniform `u` for these settings (each taken as float32, as MLX takes a
    Python float an operation meets)."""
    n, V = int(rows.shape[0]), int(rows.shape[1])
    if not 0 < k < V or k > THREADS:
        raise ValueError(
            f"a pack of {k} from rows of {V} logits: the kernel takes 0 < k < V, k <= {THREADS}"
        )
    if rows.dtype != mx.float32:
        raise ValueError("the kernel packs float32 rows")
    if V >= 1 << 24:
        raise ValueError("token ids past 2^24 are not exact in a float32 pack")
    packed, token = _kernel()(
        inputs=[rows, _settings(temperature, top_p), mx.array([u], dtype=mx.float32)],
        template=[("K", k)],
        grid=(THREADS, n, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(n, 2 * k + 3), (n,)],
        output_dtypes=[mx.float32, mx.uint32],
    )
    return packed, token
