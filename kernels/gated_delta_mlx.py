"""Gated DeltaNet kernels, MLX backend: the same math as `kernels.gated_delta`, on mx.array.

Gated delta rule from Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with
Delta Rule" (2024, arXiv:2412.06464); the chunked form is the WY / UT-transform of Yang et al.,
"Parallelizing Linear Transformers with the Delta Rule over Sequence Length" (2024,
arXiv:2406.06484). The derivations live in `kernels.gated_delta`; the tests compare these
kernels against the float64 references in `kernels.gated_delta_ref`.

Inputs may be float32, bfloat16 or float16; the work and the state are float32, the outputs
o and y come back in the input dtype. No function calls mx.eval: the caller decides when the
lazy graph runs. Shapes: q, k [L, H, Dk]; v [L, H, Dv]; g, beta [L, H]; state [H, Dk, Dv].
"""

from __future__ import annotations

import mlx.core as mx


def gated_delta_recurrent(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
) -> tuple[mx.array, mx.array]:
    """Token by token, vectorised over heads: for decode (L=1), verify and tape replay.

    Returns (o [L, H, Dv] in q's dtype, state [H, Dk, Dv] float32).
    """
    out_dtype = q.dtype
    q, k, v, g, beta = (x.astype(mx.float32) for x in (q, k, v, g, beta))
    S = state.astype(mx.float32)  # [H, Dk, Dv]
    decay = mx.exp(g)  # [L, H]
    outputs = []
    for t in range(q.shape[0]):
        S = S * decay[t][:, None, None]
        kv_mem = mx.matmul(k[t][:, None, :], S)[:, 0]  # [H, 1, Dk] @ [H, Dk, Dv] -> [H, Dv]
        delta = (v[t] - kv_mem) * beta[t][:, None]  # [H, Dv]
        S = S + k[t][:, :, None] * delta[:, None, :]  # outer product per head
        outputs.append(mx.matmul(q[t][:, None, :], S)[:, 0])  # [H, Dv]
    if not outputs:
        return mx.zeros((0, q.shape[1], v.shape[-1]), dtype=out_dtype), S
    return mx.stack(outputs).astype(out_dtype), S


def _invert_unit_lower(A: mx.array) -> mx.array:
    """(I + A)^-1 for strictly lower-triangular A [..., C, C], by blocked forward substitution.

    Merge neighbouring inverted diagonal blocks, doubling their size each level:
    inv([[M11, 0], [M21, M22]]) = [[T11, 0], [-T22 M21 T11, T22]], log2(C) levels of batched
    matmuls that run on any device (mx.linalg.solve_triangular is CPU-only). The Neumann
    doubling product (I - A)(I + A^2)(I + A^4)... would be as short but forms powers of A whose
    entries reach C(63, 31) when keys repeat, and cancel catastrophically in float32.
    """
    *batch, C, _ = A.shape
    P = 1 << max(C - 1, 0).bit_length()  # next power of two >= C
    if P != C:  # inv(blockdiag(I + A, I)) = blockdiag(inv(I + A), I)
        A = mx.pad(A, [(0, 0)] * len(batch) + [(0, P - C), (0, P - C)])
    T = mx.ones((*batch, P, 1, 1), dtype=A.dtype)  # inverted diagonal blocks [..., P/b, b, b]
    b = 1
    while b < P:
        n = P // (2 * b)
        blocks = A.reshape(*batch, n, 2 * b, n, 2 * b)
        blocks = mx.moveaxis(mx.diagonal(blocks, axis1=-4, axis2=-2), -1, -3)  # [..., n, 2b, 2b]
        M21 = blocks[..., b:, :b]  # the block below each pair of inverted blocks
        T11, T22 = T[..., 0::2, :, :], T[..., 1::2, :, :]  # [..., n, b, b]
        T21 = -(T22 @ M21 @ T11)
        top = mx.concatenate([T11, mx.zeros_like(T11)], axis=-1)  # [..., n, b, 2b]
        bottom = mx.concatenate([T21, T22], axis=-1)
        T = mx.concatenate([top, bottom], axis=-2)  # [..., n, 2b, 2b]
        b *= 2
    return T[..., 0, :C, :C]


def gated_delta_chunked(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    chunk: int = 64,
) -> tuple[mx.array, mx.array]:
    """Chunk-parallel gated delta rule for prefill; the only Python loop is over chunks.

    See `kernels.gated_delta.gated_delta_chunked` for the derivation.
    Returns (o [L, H, Dv] in q's dtype, state [H, Dk, Dv] float32).
    """
    if chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")
    out_dtype = q.dtype
    q, k, v, g, beta = (x.astype(mx.float32) for x in (q, k, v, g, beta))
    L, H, Dk = q.shape
    Dv = v.shape[-1]
    S = state.astype(mx.float32)  # [H, Dk, Dv]
    if L == 0:
        return mx.zeros((0, H, Dv), dtype=out_dtype), S
    C = min(chunk, L)
    N = -(-L // C)
    pad = N * C - L
    if pad:  # g=0, beta=0, k=v=q=0 rows leave the state untouched
        q, k, v, g, beta = (
            mx.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) for x in (q, k, v, g, beta)
        )

    def by_chunk(x: mx.array) -> mx.array:  # [N*C, H, ...] -> [N, H, C, ...]
        return mx.swapaxes(x.reshape(N, C, H, *x.shape[2:]), 1, 2)

    q, k, v, g, beta = (by_chunk(x) for x in (q, k, v, g, beta))  # q [N, H, C, Dk], g [N, H, C]

    G = mx.cumsum(g, axis=-1)  # [N, H, C]
    causal = mx.tril(mx.ones((C, C), dtype=mx.bool_))
    # Mask before exp: for j > i, G_i - G_j >= 0 can be large and would overflow.
    D = mx.exp(mx.where(causal, G[..., :, None] - G[..., None, :], -float("inf")))  # [N,H,C,C]

    k_beta = k * beta[..., None]  # [N, H, C, Dk]
    v_beta = v * beta[..., None]  # [N, H, C, Dv]
    kT = mx.swapaxes(k, -1, -2)  # [N, H, Dk, C]
    A = mx.tril((k_beta @ kT) * D, k=-1)  # [N, H, C, C]
    T = _invert_unit_lower(A)  # [N, H, C, C]
    W_v = T @ v_beta  # [N, H, C, Dv]
    W_k = T @ (k_beta * mx.exp(G)[..., None])  # [N, H, C, Dk]

    attn = (q @ kT) * D  # [N, H, C, C], causal incl. the diagonal
    # o = exp(G) q S0 + attn (W_v - W_k S0) = (exp(G) q - attn W_k) S0 + attn W_v
    q_state = q * mx.exp(G)[..., None] - attn @ W_k  # [N, H, C, Dk]
    o_intra = attn @ W_v  # [N, H, C, Dv]
    k_to_end = mx.swapaxes(k * mx.exp(G[..., -1:] - G)[..., None], -1, -2)  # [N, H, Dk, C]
    chunk_decay = mx.exp(G[..., -1])[..., None, None]  # [N, H, 1, 1]

    # One matmul per chunk reads S0 for both the outputs and the corrections.
    lhs = mx.concatenate([q_state, W_k], axis=-2)  # [N, H, 2C, Dk]
    outputs = []
    for n in range(N):
        read = lhs[n] @ S  # [H, 2C, Dv]
        outputs.append(o_intra[n] + read[:, :C])
        u = W_v[n] - read[:, C:]  # [H, C, Dv]
        S = S * chunk_decay[n] + k_to_end[n] @ u
    o = mx.swapaxes(mx.stack(outputs), 1, 2).reshape(N * C, H, Dv)[:L]  # [L, H, Dv]
    return o.astype(out_dtype), S


def causal_conv1d(x: mx.array, weight: mx.array, conv_state: mx.array) -> tuple[mx.array, mx.array]:
    """Depthwise causal conv over time, no activation. Returns (y [L, C], new conv_state).

    x [L, C], weight [C, K], conv_state [K-1, C] = the previous K-1 inputs (zeros at the start).
    y[t, c] = sum_j weight[c, j] * xpad[t + j, c] with xpad = concat(conv_state, x).
    """
    L = x.shape[0]
    K = weight.shape[1]
    xpad = mx.concatenate([conv_state.astype(x.dtype), x], axis=0)  # [K-1+L, C]
    xpad32 = xpad.astype(mx.float32)
    w = weight.astype(mx.float32)
    y = mx.zeros(x.shape, dtype=mx.float32)
    for j in range(K):  # K shifted slices, one per tap
        y = y + xpad32[j : j + L] * w[:, j]
    return y.astype(x.dtype), xpad[xpad.shape[0] - (K - 1) :]


def conv_state_after(conv_state: mx.array, x_rows: mx.array) -> mx.array:
    """The conv window after appending x_rows, without computing outputs (tape replay)."""
    keep = conv_state.shape[0]  # K - 1
    xpad = mx.concatenate([conv_state, x_rows.astype(conv_state.dtype)], axis=0)
    return xpad[xpad.shape[0] - keep :]
