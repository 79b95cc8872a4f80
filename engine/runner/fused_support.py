"""Which models the fused decode paths take (engine/runner/fused.py), and their shapes.

The five kernels take full-attention decoders of the plain Llama kind; the one-launch step
also takes q/k norm, any single rotation table, and hybrids (Qwen3.5: Gated DeltaNet
layers beside gated full attention with partial rotary embeddings,
engine/runner/fused_hybrid.py). Every other feature is refused by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.models.base import FULL, LINEAR, AttentionBlock, DecoderModel, ModelConfig
from engine.runner import fused_hybrid
from kernels import step_weights
from kernels.fused_decode_cuda import Shapes
from kernels.fused_step_cuda import step_unsupported


def unsupported_reason(model: DecoderModel, step: bool = False) -> str | None:
    """Why `model` can't take the fused path (with `step`, the one-launch step: it takes
    any rotation table, q/k norm and hybrids too), or None."""
    cfg = model.config
    if model.ops.name != "mlx":
        return "needs the MLX backend"
    kinds = {cfg.layer_type(i) for i in range(cfg.num_layers)}
    if kinds != {FULL} and not (step and kinds == {FULL, LINEAR}):
        return "only full-attention layers (and Gated DeltaNet in the one-launch step)"
    for feature, present in (
        ("gated attention", cfg.attn_output_gate),
        ("q/k norm", cfg.qk_norm),
        ("partial rotary embeddings", cfg.rope_dims != cfg.head_dim),
    ):
        if present and not step:
            return f"{feature} is fused in the one-launch step only"
    features = model.unfused_features()
    if step and "scaled rope" in features and rope_table(model) is not None:
        features.remove("scaled rope")
    if step and "norm offsets" in features:  # added at load: the step reads 1 + w as stored
        features.remove("norm offsets")
    if features:
        return f"{', '.join(features)} not fused"
    attention = [layer for i, layer in enumerate(model.layers) if cfg.layer_type(i) == FULL]
    if not all(isinstance(layer.mixer, AttentionBlock) for layer in attention):
        return "unknown mixer"
    if reason := fused_hybrid.mixers_unsupported(model):
        return reason
    return model_shapes(cfg).check()


def rope_table(model: DecoderModel) -> np.ndarray | None:
    """The inverse frequencies [rope_dims / 2] (float32) every attention layer rotates by,
    if one table says it all: no attention factor (YaRN's), no dynamic range; else None."""
    ropes = [r for layer in model.layers if (r := getattr(layer.mixer, "rope", None))]
    if not ropes or any(r.mscale != 1.0 or r.max_positions for r in ropes):
        return None
    tables = [r.inv_freq if r.inv_freq is not None else plain_inv_freq(r) for r in ropes]
    if any(not np.array_equal(t, tables[0]) for t in tables):
        return None
    return tables[0].astype(np.float32)


def plain_inv_freq(rope: Any) -> np.ndarray:
    """theta ** (-2i / dims), i < dims / 2, as the rope computes it, in float64."""
    return 1.0 / rope.theta ** (np.arange(0, rope.dims, 2, dtype=np.float64) / rope.dims)


def step_unsupported_reason(model: DecoderModel) -> str | None:
    """Why the one-launch step can't take `model` (its features, its shapes, its weights as
    stored), or None."""
    shapes = model_shapes(model.config)
    reason = unsupported_reason(model, step=True) or step_unsupported(shapes)
    if reason:
        return reason
    if shapes.linear is not None and (reason := shapes.linear.check(model.config.num_layers)):
        return reason
    for w in step_weights.model_matrices(model):
        reason = step_weights.matrix_unsupported(w)
        if reason:
            return f"{reason} in the weight table"
    return None


# Above this the five kernels' dense copy costs more memory than it is worth (the
# one-launch step makes none): a large model's decode is bound by reading its weights.
MAX_DENSE_BYTES = 2 << 30


def dense_bytes(model: DecoderModel) -> int:
    """Bytes of the dense weight copy the fused path makes (model dtype)."""
    cfg = model.config
    D, F, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    per_layer = D * (cfg.num_heads + 2 * cfg.num_kv_heads) * Dh + cfg.num_heads * Dh * D + 3 * D * F
    tables = cfg.vocab_size * D * (1 if model.lm_head is model.embed else 2)
    itemsize = 4 if "float32" in str(model.ops.dtype) else 2
    return (cfg.num_layers * per_layer + tables) * itemsize


def model_shapes(cfg: ModelConfig) -> Shapes:
    return Shapes(
        hidden=cfg.hidden_size,
        heads=cfg.num_heads,
        kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        intermediate=cfg.intermediate_size,
        vocab=cfg.vocab_size,
        eps=cfg.rms_norm_eps,
        rope_base=cfg.rope_theta,
        rope_traditional=cfg.rope_traditional,
        qk_norm=cfg.qk_norm,
        attn_gate=cfg.attn_output_gate,
        rope_dims=cfg.rope_dims if cfg.rope_dims != cfg.head_dim else 0,
        linear=fused_hybrid.linear_shapes(cfg),
    )
