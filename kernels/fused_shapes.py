"""A full-attention decoder's shapes, as the fused decode kernels and their reference take them.

Its own module because the CUDA kernels (kernels/fused_decode_cuda.py,
kernels/fused_step_cuda.py) and their MLX-ops reference (kernels/fused_decode_ref.py) all
take it, and the CUDA module falls back to the reference where there is no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass


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
        return None
