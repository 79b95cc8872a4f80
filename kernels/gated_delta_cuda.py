"""Gated delta rule recurrence as one CUDA kernel (MLX's `mx.fast.cuda_kernel`).

The MLX recurrent form (`kernels.gated_delta_mlx.gated_delta_recurrent`) issues ~6 small
kernels per row; decode, verify and tape replay on a GPU are launch-bound, so this
kernel does all L rows in one launch. A pair of threads owns one column j of one head's state
S[h, :, j] (Dk / 2 floats each, in registers) and walks the rows:

    S *= exp(g_t);  delta = (v_t[j] - k_t . S[:, j]) * beta_t;  S[:, j] += k_t * delta
    o_t[j] = q_t . S[:, j]

A row is `gdn_row` (kernels/cuda/gated_delta_row.cuh), the one-launch step's own row with
the same PAIR: a hybrid's verify tape replayed here gives the state its single steps gave,
bit for bit. One build takes any number of rows (L is read from q's shape), so a prefill
chunk may take it too (`MlxOps.gdn_prefill`, BRANCHCHAT_GDN_PREFILL=recurrent), in place
of the chunked form's many small MLX operations.

Same math as `kernels.gated_delta_ref.gated_delta_reference` (Yang et al. 2024), which the
GPU test compares it against. Only built where MLX runs on CUDA.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import mlx.core as mx

from kernels import cuda

MAX_DK = 256
# Threads a value column, here and in the one-launch step's recurrence (one value for both:
# their rows must round alike). 2 holds half a column a thread, which the step's build needs
# to keep its registers (nvcc: 2 KB of spills at 1, none at 2). On an H100 (session 33) the
# Qwen3.5-0.8B shape decoded 662 / 666 / 638 tok/s at 128 / 512 / 2,048 context at 2
# against 632 / 643 / 607 at 1, and the verify, replay and hybrid tests passed at 2.
PAIR = 2

# Threads a value column in a prefill chunk's rows (`gated_delta_prefill`), which need not
# round as the step's do: more threads a column make each row's dependent chain of DK
# multiply-adds DK / P long and put more blocks on the device (a head's 128 columns at
# P = 1 fill one block: 16 of an H100's 132 SMs for the Qwen3.5-0.8B shape). On an H100
# (bench/gpu/prefill_split.py's `gdn_kernel`, session 33) one layer's 2,048 rows took
# 4.58 / 3.05 / 3.51 / 2.81 ms at P = 1 / 2 / 4 / 8, and 3.11 / 2.27 / 2.52 / 1.56 ms
# fetching a row ahead; 8 with the fetch is fastest at 128 and 512 rows too.
PREFILL_PAIR = 8

# Whether a prefill chunk's rows take gated_delta_prefill.cu, which fetches the next row's
# inputs while one computes (the same rows as gated_delta_recurrent.cu at the same pair).
PREFILL_PREFETCH = True

_HEADER = cuda.source("gated_delta_row.cuh")


is_available = cuda.is_available  # where MLX's default device is a CUDA GPU


@cache
def _kernel(name: str = "gated_delta_recurrent") -> Any:
    """The replay's kernel, or with "gated_delta_prefill" the prefill's (the same rows, the
    next row's inputs fetched while one computes)."""
    return mx.fast.cuda_kernel(
        name=name,
        input_names=["q", "k", "v", "g", "beta", "state"],
        output_names=["out", "state_out"],
        source=cuda.source(f"{name}.cu"),
        header=_HEADER,
    )


def gated_delta_recurrent(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    pair: int | None = None,
    prefetch: bool = False,
) -> tuple[mx.array, mx.array]:
    """Same contract as kernels.gated_delta_mlx.gated_delta_recurrent: (o [L, H, Dv], state).
    `pair` threads a value column (None: PAIR, whose rows are the one-launch step's);
    `prefetch` runs gated_delta_prefill.cu, whose rows are this kernel's at the same pair."""
    L, H, Dk = q.shape  # L: read by the kernel from q's shape (one build for every L)
    Dv = v.shape[-1]
    if Dk > MAX_DK:
        raise ValueError(f"key head dim {Dk} exceeds the kernel's register budget ({MAX_DK})")
    pair = PAIR if pair is None else pair
    if pair not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"pair must be a power of two up to a warp, not {pair}")
    if Dk % pair:
        raise ValueError(f"key head dim {Dk} is not a multiple of {pair}")
    block = min(256, 32 * -(-Dv * pair // 32))  # whole warps: every lane joins the pair sums
    if prefetch:  # a thread fetches each feature of a row
        block = max(block, 32 * -(-Dk // 32))
    kernel = _kernel("gated_delta_prefill" if prefetch else "gated_delta_recurrent")
    out, state_out = kernel(
        inputs=[q, k, v, g, beta, state.astype(mx.float32)],
        template=[("T", q.dtype), ("DK", Dk), ("Dv", Dv), ("H", H), ("P", pair)],
        grid=(-(-Dv * pair // block) * block, H, 1),
        threadgroup=(block, 1, 1),
        output_shapes=[(L, H, Dv), (H, Dk, Dv)],
        output_dtypes=[q.dtype, mx.float32],
    )
    return out, state_out


def gated_delta_prefill(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """A prefill chunk's rows (`MlxOps.gdn_prefill` "recurrent"): PREFILL_PAIR threads a
    value column, with PREFILL_PREFETCH the kernel that fetches a row ahead."""
    return gated_delta_recurrent(q, k, v, g, beta, state, PREFILL_PAIR, PREFILL_PREFETCH)
