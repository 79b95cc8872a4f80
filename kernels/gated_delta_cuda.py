"""Gated delta rule recurrence as one CUDA kernel (MLX's `mx.fast.cuda_kernel`).

The MLX recurrent form (`kernels.gated_delta_mlx.gated_delta_recurrent`) issues ~6 small
kernels per row; decode, verify and tape replay on a GPU are launch-bound, so this
kernel does all L rows in one launch. One thread owns one column j of one head's state
S[h, :, j] (Dk floats in registers) and walks the rows:

    S *= exp(g_t);  delta = (v_t[j] - k_t . S[:, j]) * beta_t;  S[:, j] += k_t * delta
    o_t[j] = q_t . S[:, j]

Same math as `kernels.gated_delta_ref.gated_delta_reference` (Yang et al. 2024), which the
GPU test compares it against. Only built where MLX runs on CUDA.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import mlx.core as mx

MAX_DK = 256

_SOURCE = """
    const int j = threadIdx.x + blockIdx.x * blockDim.x;  // value column
    const int h = blockIdx.y;                              // head
    if (j >= Dv) return;
    float s[DK];
    for (int i = 0; i < DK; ++i) s[i] = state[(h * DK + i) * Dv + j];
    for (int t = 0; t < L; ++t) {
        const int row = t * H + h;
        const float decay = expf(static_cast<float>(g[row]));
        const float b = static_cast<float>(beta[row]);
        float kv = 0.f;
        for (int i = 0; i < DK; ++i) {
            s[i] *= decay;
            kv += s[i] * static_cast<float>(k[row * DK + i]);
        }
        const float delta = (static_cast<float>(v[row * Dv + j]) - kv) * b;
        float o = 0.f;
        for (int i = 0; i < DK; ++i) {
            s[i] += static_cast<float>(k[row * DK + i]) * delta;
            o += s[i] * static_cast<float>(q[row * DK + i]);
        }
        out[row * Dv + j] = static_cast<T>(o);
    }
    for (int i = 0; i < DK; ++i) state_out[(h * DK + i) * Dv + j] = s[i];
"""


def is_available() -> bool:
    """True where MLX's default device is a CUDA GPU."""
    try:
        return bool(mx.default_device() == mx.gpu and mx.cuda.is_available())
    except AttributeError:
        return False


@cache
def _kernel() -> Any:
    return mx.fast.cuda_kernel(
        name="gated_delta_recurrent",
        input_names=["q", "k", "v", "g", "beta", "state"],
        output_names=["out", "state_out"],
        source=_SOURCE,
    )


def gated_delta_recurrent(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """Same contract as kernels.gated_delta_mlx.gated_delta_recurrent: (o [L, H, Dv], state)."""
    L, H, Dk = q.shape
    Dv = v.shape[-1]
    if Dk > MAX_DK:
        raise ValueError(f"key head dim {Dk} exceeds the kernel's register budget ({MAX_DK})")
    block = min(128, Dv)
    out, state_out = _kernel()(
        inputs=[q, k, v, g, beta, state.astype(mx.float32)],
        template=[("T", q.dtype), ("DK", Dk), ("Dv", Dv), ("L", L), ("H", H)],
        grid=(-(-Dv // block) * block, H, 1),
        threadgroup=(block, 1, 1),
        output_shapes=[(L, H, Dv), (H, Dk, Dv)],
        output_dtypes=[q.dtype, mx.float32],
    )
    return out, state_out
