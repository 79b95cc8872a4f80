"""What each fused decode kernel computes, in plain MLX ops (any device).

The contract `kernels.fused_decode_cuda.CudaKernels` implements; the GPU tests compare
the kernels against it, and on a CPU it lets the fused decode path itself (cache writes,
positions, compiled step) be tested end to end.
"""

from __future__ import annotations

import mlx.core as mx

from kernels.fused_shapes import Shapes


def _rms(x: mx.array, nw: mx.array, eps: float) -> mx.array:
    return x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + eps) * nw


class ReferenceKernels:
    def __init__(self, shapes: Shapes) -> None:
        self.s = shapes

    def _rope(self, x: mx.array, pos: mx.array) -> mx.array:
        """x [M, heads, DH] at positions pos + m."""
        s = self.s
        M, _, DH = x.shape
        half = DH // 2
        inv_freq = mx.power(s.rope_base, -2.0 * mx.arange(half, dtype=mx.float32) / DH)
        angle = (pos.astype(mx.float32) + mx.arange(M, dtype=mx.float32))[:, None] * inv_freq
        cos, sin = mx.cos(angle)[:, None, :], mx.sin(angle)[:, None, :]
        if s.rope_traditional:
            a, b = x[..., 0::2], x[..., 1::2]
            ra, rb = a * cos - b * sin, a * sin + b * cos
            return mx.stack([ra, rb], axis=-1).reshape(x.shape)
        a, b = x[..., :half], x[..., half:]
        return mx.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    def qkv(self, x: mx.array, nw: mx.array, w: mx.array, pos: mx.array) -> list[mx.array]:
        s = self.s
        M = x.shape[0]
        y = _rms(x, nw, s.eps) @ w.astype(mx.float32).T
        qd, kd = s.heads * s.head_dim, s.kv_heads * s.head_dim
        q = self._rope(y[:, :qd].reshape(M, s.heads, s.head_dim), pos).reshape(M, qd)
        k = self._rope(y[:, qd : qd + kd].reshape(M, s.kv_heads, s.head_dim), pos)
        v = y[:, qd + kd :].reshape(M, s.kv_heads, s.head_dim)
        return [q, k.transpose(1, 0, 2).astype(w.dtype), v.transpose(1, 0, 2).astype(w.dtype)]

    def attend(self, q: mx.array, keys: mx.array, values: mx.array, pos: mx.array) -> mx.array:
        s = self.s
        M = q.shape[0]
        group = s.heads // s.kv_heads
        qh = q.reshape(M, s.heads, s.head_dim).transpose(1, 0, 2)  # [H, M, DH]
        k = mx.repeat(keys.astype(mx.float32), group, axis=0)  # [H, CAP, DH]
        v = mx.repeat(values.astype(mx.float32), group, axis=0)
        scores = (qh @ k.transpose(0, 2, 1)) * s.head_dim**-0.5  # [H, M, CAP]
        key_pos = mx.arange(keys.shape[1])[None, :]
        visible = key_pos <= (pos + mx.arange(M))[:, None]
        scores = mx.where(visible[None], scores, -mx.inf)
        o = mx.softmax(scores, axis=-1) @ v  # [H, M, DH]
        return o.transpose(1, 0, 2).reshape(M, s.heads * s.head_dim)

    def residual(self, a: mx.array, w: mx.array, res: mx.array) -> mx.array:
        return res + a @ w.astype(mx.float32).T

    def gate_up(self, x: mx.array, nw: mx.array, w: mx.array) -> mx.array:
        F = self.s.intermediate
        y = _rms(x, nw, self.s.eps) @ w.astype(mx.float32).T
        g, u = y[:, :F], y[:, F:]
        return g * mx.sigmoid(g) * u

    def head(self, x: mx.array, nw: mx.array, w: mx.array) -> mx.array:
        return _rms(x, nw, self.s.eps) @ w.astype(mx.float32).T
