"""Gated DeltaNet kernels, numpy backend; float64 references in `kernels.gated_delta_ref`.

The linear-attention layers of Qwen3-Next / Qwen3.5 keep a per-head matrix state S [Dk, Dv]
updated by the gated delta rule (Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving
Mamba2 with Delta Rule", 2024, arXiv:2412.06464), one step per token t:

    S   = exp(g_t) * S                          decay, g_t <= 0
    u_t = beta_t * (v_t - S^T k_t)              delta-rule correction
    S   = S + k_t u_t^T
    o_t = S^T q_t

`gated_delta_recurrent` runs that loop (decode, verification, tape replay);
`gated_delta_chunked` computes the same thing a chunk of C tokens at a time with matmuls, using
the WY / UT-transform form of DeltaNet (Yang et al., "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length", 2024, arXiv:2406.06484) as in flash-linear-attention's
`chunk_gated_delta_rule`. The short causal depthwise convolution in front of q, k, v lives here
too.

All functions are pure: inputs are never written to and fresh arrays are returned, because
callers keep old states as snapshots. Shapes have no batch axis:
q, k [L, H, Dk]; v [L, H, Dv]; g, beta [L, H]; state [H, Dk, Dv]; output o [L, H, Dv].
"""

from __future__ import annotations

import numpy as np


def gated_delta_recurrent(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Token by token, vectorised over heads: for decode (L=1) and short verify/replay runs.

    Replaying a recorded tape from a restored state is this call on the recorded rows.
    Returns (o [L, H, Dv], state [H, Dk, Dv]), both float32.
    """
    q, k, v, g, beta = (np.asarray(x, dtype=np.float32) for x in (q, k, v, g, beta))
    S = np.array(state, dtype=np.float32)  # [H, Dk, Dv], our own copy, updated in place
    L, H, _ = q.shape
    o = np.empty((L, H, v.shape[-1]), dtype=np.float32)
    decay = np.exp(g)  # [L, H]
    for t in range(L):
        S *= decay[t][:, None, None]
        kv_mem = np.matmul(k[t][:, None, :], S)[:, 0]  # [H, 1, Dk] @ [H, Dk, Dv] -> [H, Dv]
        delta = (v[t] - kv_mem) * beta[t][:, None]  # [H, Dv]
        S += k[t][:, :, None] * delta[:, None, :]  # outer product per head
        o[t] = np.matmul(q[t][:, None, :], S)[:, 0]  # [H, Dv]
    return o, S


def _invert_unit_lower(A: np.ndarray) -> np.ndarray:
    """(I + A)^-1 for strictly lower-triangular A [..., C, C], by blocked forward substitution.

    Start from the 1x1 diagonal blocks (all ones) and merge neighbouring blocks, doubling the
    size each level: inv([[M11, 0], [M21, M22]]) = [[T11, 0], [-T22 M21 T11, T22]]. That is
    log2(C) levels of batched matmuls, and, unlike the Neumann series sum (-A)^n, it never forms
    powers of A, whose entries can reach C(63, 31) when keys repeat.
    """
    *batch, C, _ = A.shape
    P = 1 << max(C - 1, 0).bit_length()  # next power of two >= C
    if P != C:  # inv(blockdiag(I + A, I)) = blockdiag(inv(I + A), I)
        A = np.pad(A, [(0, 0)] * len(batch) + [(0, P - C), (0, P - C)])
    T = np.ones((*batch, P, 1, 1), dtype=A.dtype)  # inverted diagonal blocks [..., P/b, b, b]
    b = 1
    while b < P:
        n = P // (2 * b)
        blocks = A.reshape(*batch, n, 2 * b, n, 2 * b)
        blocks = np.moveaxis(np.diagonal(blocks, axis1=-4, axis2=-2), -1, -3)  # [..., n, 2b, 2b]
        M21 = blocks[..., b:, :b]  # the block below each pair of inverted blocks
        T11, T22 = T[..., 0::2, :, :], T[..., 1::2, :, :]  # [..., n, b, b]
        merged = np.zeros((*batch, n, 2 * b, 2 * b), dtype=A.dtype)
        merged[..., :b, :b] = T11
        merged[..., b:, :b] = -(T22 @ M21 @ T11)
        merged[..., b:, b:] = T22
        T = merged
        b *= 2
    return T[..., 0, :C, :C]


def gated_delta_chunked(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    chunk: int = 64,
) -> tuple[np.ndarray, np.ndarray]:
    """Chunk-parallel gated delta rule for prefill; the only Python loop is over chunks.

    Within a chunk of C tokens with cumulative log-decay G_t = g_1 + ... + g_t and start state
    S0, unrolling the recurrence gives, with decay D_tj = exp(G_t - G_j) for j <= t:

        u_t + beta_t sum_{j<t} D_tj (k_t.k_j) u_j = beta_t v_t - beta_t exp(G_t) S0^T k_t

    i.e. (I + A) U = V_beta - (K_beta * exp(G)) S0 with A strictly lower triangular. With
    T = (I + A)^-1 (the UT transform) the corrections are U = W_v - W_k S0, and

        o_t   = exp(G_t) S0^T q_t + sum_{j<=t} D_tj (q_t.k_j) u_j
        S_end = exp(G_C) S0 + sum_j exp(G_C - G_j) k_j u_j^T

    Everything but the S0-dependent products is computed for all chunks at once.
    Returns (o [L, H, Dv], state [H, Dk, Dv]), both float32.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")
    q, k, v, g, beta = (np.asarray(x, dtype=np.float32) for x in (q, k, v, g, beta))
    L, H, Dk = q.shape
    Dv = v.shape[-1]
    S = np.array(state, dtype=np.float32)  # [H, Dk, Dv]
    if L == 0:
        return np.zeros((0, H, Dv), dtype=np.float32), S
    C = min(chunk, L)
    N = -(-L // C)
    pad = N * C - L
    if pad:  # g=0, beta=0, k=v=q=0 rows leave the state untouched
        q, k, v, g, beta = (
            np.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) for x in (q, k, v, g, beta)
        )

    def by_chunk(x: np.ndarray) -> np.ndarray:  # [N*C, H, ...] -> [N, H, C, ...]
        return np.ascontiguousarray(x.reshape(N, C, H, *x.shape[2:]).swapaxes(1, 2))

    q, k, v, g, beta = (by_chunk(x) for x in (q, k, v, g, beta))  # q [N, H, C, Dk], g [N, H, C]

    G = np.cumsum(g, axis=-1)  # [N, H, C]
    causal = np.tril(np.ones((C, C), dtype=bool))
    # Mask before exp: for j > i, G_i - G_j >= 0 can be large and would overflow.
    D = np.exp(np.where(causal, G[..., :, None] - G[..., None, :], -np.inf))  # [N, H, C, C]

    k_beta = k * beta[..., None]  # [N, H, C, Dk]
    v_beta = v * beta[..., None]  # [N, H, C, Dv]
    kkT = k_beta @ k.swapaxes(-1, -2)  # [N, H, C, C]
    A = np.tril(kkT * D, k=-1)
    T = _invert_unit_lower(A)  # [N, H, C, C]
    W_v = T @ v_beta  # [N, H, C, Dv]
    W_k = T @ (k_beta * np.exp(G)[..., None])  # [N, H, C, Dk]

    attn = (q @ k.swapaxes(-1, -2)) * D  # [N, H, C, C], causal incl. the diagonal
    # o = exp(G) q S0 + attn (W_v - W_k S0) = (exp(G) q - attn W_k) S0 + attn W_v
    q_state = q * np.exp(G)[..., None] - attn @ W_k  # [N, H, C, Dk]
    o_intra = attn @ W_v  # [N, H, C, Dv]
    k_to_end = (k * np.exp(G[..., -1:] - G)[..., None]).swapaxes(-1, -2)  # [N, H, Dk, C]
    chunk_decay = np.exp(G[..., -1])[..., None, None]  # [N, H, 1, 1]

    # One matmul per chunk reads S0 for both the outputs and the corrections.
    lhs = np.concatenate([q_state, W_k], axis=-2)  # [N, H, 2C, Dk]
    o = np.empty((N, H, C, Dv), dtype=np.float32)
    for n in range(N):
        read = lhs[n] @ S  # [H, 2C, Dv]
        o[n] = o_intra[n] + read[:, :C]
        u = W_v[n] - read[:, C:]  # [H, C, Dv]
        S *= chunk_decay[n]  # S is our own copy
        S += k_to_end[n] @ u
    o = o.swapaxes(1, 2).reshape(N * C, H, Dv)[:L]  # [L, H, Dv]
    return o, S


def causal_conv1d(
    x: np.ndarray, weight: np.ndarray, conv_state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv over time, no activation. Returns (y [L, C], new conv_state).

    x [L, C], weight [C, K], conv_state [K-1, C] = the previous K-1 inputs (zeros at the start).
    y[t, c] = sum_j weight[c, j] * xpad[t + j, c] with xpad = concat(conv_state, x).
    """
    x = np.asarray(x, dtype=np.float32)
    weight = np.asarray(weight, dtype=np.float32)
    L = x.shape[0]
    K = weight.shape[1]
    xpad = np.concatenate([np.asarray(conv_state, dtype=np.float32), x], axis=0)  # [K-1+L, C]
    y = np.zeros_like(x)
    for j in range(K):  # K shifted slices, one per tap
        y += xpad[j : j + L] * weight[:, j]
    return y, xpad[xpad.shape[0] - (K - 1) :].copy()


def conv_state_after(conv_state: np.ndarray, x_rows: np.ndarray) -> np.ndarray:
    """The conv window after appending x_rows, without computing outputs (tape replay)."""
    keep = conv_state.shape[0]  # K - 1
    xpad = np.concatenate([conv_state, np.asarray(x_rows, dtype=conv_state.dtype)], axis=0)
    return xpad[xpad.shape[0] - keep :].copy()
