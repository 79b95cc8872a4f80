"""The gated delta rule and the short causal convolution of Gated DeltaNet layers, as plain
float64 loops: the definitions every fast kernel is tested against (kernels/gated_delta.py
for NumPy, kernels/gated_delta_mlx.py for MLX, kernels/gated_delta_cuda.py on a GPU).

Per head, a matrix state S [Dk, Dv] and one step per token t (Yang, Kautz, Hatamizadeh,
"Gated Delta Networks: Improving Mamba2 with Delta Rule", 2024, arXiv:2412.06464):

    S   = exp(g_t) * S                          decay, g_t <= 0
    u_t = beta_t * (v_t - S^T k_t)              delta-rule correction
    S   = S + k_t u_t^T
    o_t = S^T q_t

Shapes have no batch axis: q, k [L, H, Dk]; v [L, H, Dv]; g, beta [L, H];
state [H, Dk, Dv]; output o [L, H, Dv].
"""

from __future__ import annotations

import numpy as np


def gated_delta_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence one token and one head at a time, in float64. Returns (o, state)."""
    q, k, v, g, beta = (np.asarray(x, dtype=np.float64) for x in (q, k, v, g, beta))
    S = np.array(state, dtype=np.float64)  # [H, Dk, Dv], a copy
    L, H, _ = q.shape
    o = np.zeros((L, H, v.shape[-1]), dtype=np.float64)
    for t in range(L):
        for h in range(H):
            S[h] = S[h] * np.exp(g[t, h])
            kv_mem = S[h].T @ k[t, h]  # [Dv]
            delta = (v[t, h] - kv_mem) * beta[t, h]  # [Dv]
            S[h] = S[h] + np.outer(k[t, h], delta)
            o[t, h] = S[h].T @ q[t, h]
    return o, S


def causal_conv1d_reference(
    x: np.ndarray, weight: np.ndarray, conv_state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal convolution, a loop over tokens and channels, in float64."""
    x = np.asarray(x, dtype=np.float64)  # [L, C]
    weight = np.asarray(weight, dtype=np.float64)  # [C, K]
    L, C = x.shape
    K = weight.shape[1]
    xpad = np.concatenate([np.asarray(conv_state, dtype=np.float64), x], axis=0)  # [K-1+L, C]
    y = np.zeros((L, C), dtype=np.float64)
    for t in range(L):
        for c in range(C):
            y[t, c] = sum(weight[c, j] * xpad[t + j, c] for j in range(K))
    return y, xpad[xpad.shape[0] - (K - 1) :].copy()
