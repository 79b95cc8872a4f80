"""A full-attention decoder's shapes, as the fused decode kernels and their reference take them.

Its own module because the CUDA kernels (kernels/fused_decode_cuda.py,
kernels/fused_step_cuda.py) and their MLX-ops reference (kernels/fused_decode_ref.py) all
take it, and the CUDA module falls back to the reference where there is no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIVATIONS = ("silu", "gelu_tanh")  # the MLP's, by the step's ACT constant


@dataclass(frozen=True)
class GdnShapes:
    """A hybrid's Gated DeltaNet layers (the one-launch step only): which layers they are,
    key and value heads and their dims, the conv's taps, and whether value head h reads key
    head h % key_heads (a GGUF's tiled order) or h // (value_heads / key_heads)."""

    layers: tuple[int, ...]  # the linear layers' indices; the others are full attention
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int
    tiled: bool

    @property
    def conv_channels(self) -> int:  # q | k | v
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim

    @property
    def in_rows(self) -> int:  # in_proj's rows: q | k | v | z | b | a
        return self.conv_channels + self.value_heads * self.value_dim + 2 * self.value_heads

    def tape_row(self) -> int:
        """floats of a row's tape: q, k [value_heads, key_dim], v, g, beta, conv input"""
        nv = self.value_heads
        return 2 * nv * self.key_dim + nv * self.value_dim + 2 * nv + self.conv_channels

    def check(self, num_layers: int | None = None) -> str | None:
        if self.key_dim > 256 or self.value_dim > 128:
            return f"linear heads of {self.key_dim} x {self.value_dim} (at most 256 x 128)"
        if self.key_dim % 8 or self.value_dim % 16 or self.value_heads % self.key_heads:
            return (
                f"linear heads of {self.key_dim} x {self.value_dim} (multiples of 8 x 16), or "
                f"{self.value_heads} value heads for {self.key_heads} key heads"
            )
        if self.value_heads % 2:  # in_proj's b and a rows: warps take row pairs
            return f"{self.value_heads} value heads (an even count is needed)"
        if not 2 <= self.conv_kernel <= 8:
            return f"a conv of {self.conv_kernel} taps"
        if num_layers is not None and (num_layers > 128 or len(self.layers) == num_layers):
            return "more than 128 layers, or no attention layer"
        return None


@dataclass(frozen=True)
class Shapes:
    hidden: int  # D
    heads: int  # H
    kv_heads: int  # HKV
    head_dim: int  # DH
    intermediate: int  # F
    vocab: int  # V
    eps: float
    rope_base: float
    rope_traditional: bool
    qk_norm: bool = False  # q and k RMS-normed per head before the rotation (Qwen3)
    # the one-launch step only: q_proj's [query | gate] per head and a sigmoid gate on the
    # attention's output, rotation of the first rope_dims features (0: all), GDN layers
    attn_gate: bool = False
    rope_dims: int = 0
    linear: GdnShapes | None = None
    # the one-launch step only (Gemma 3): layers attending to the last `window` positions
    # through a ring of their KV rows, norms after the attention and the MLP as well as
    # before, the MLP's activation, the embedding's scale, the attention's scale (0:
    # head_dim ** -0.5)
    sliding: tuple[int, ...] = ()
    window: int = 0
    sandwich: bool = False
    act: str = "silu"
    embed_scale: float = 1.0
    attn_scale: float = 0.0
    rope_per_layer: bool = False  # a rotation table a layer (else one for every layer)

    def check(self) -> str | None:
        """Why these shapes can't run through the kernels, or None."""
        if self.head_dim % 8 or self.head_dim > 256:
            return f"head_dim {self.head_dim} (needs a multiple of 8, at most 256)"
        for name in ("hidden", "intermediate"):
            if getattr(self, name) % 8:
                return f"{name} size {getattr(self, name)} is not a multiple of 8"
        if (self.heads * self.head_dim) % 8:
            return "heads * head_dim is not a multiple of 8"
        if self.heads % self.kv_heads:
            return "heads is not a multiple of kv_heads"
        if self.rope_dims and (self.rope_dims % 2 or self.rope_dims > self.head_dim):
            return f"{self.rope_dims} rotated features of {self.head_dim}"
        if self.attn_gate and not self.qk_norm:
            return "an output gate without q/k norm"
        if self.act not in ACTIVATIONS:
            return f"the {self.act} activation"
        if bool(self.sliding) != bool(self.window) or self.window < 0:
            return f"sliding layers {self.sliding} with a window of {self.window}"
        if self.linear is not None:
            return self.linear.check()
        return None
