"""Which models the fused decode paths take (engine/runner/fused.py), and their shapes.

The five kernels take full-attention decoders of the plain Llama kind; the one-launch step
also takes q/k norm, a rotation table a layer, hybrids (Qwen3.5: Gated DeltaNet layers
beside gated full attention with partial rotary embeddings, engine/runner/fused_hybrid.py)
and Gemma 3 (sliding-window layers through their KV ring, sandwich norms, GELU, scaled
embeddings and attention). Every other feature is refused by name.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from engine.models.base import (
    FULL,
    LINEAR,
    SLIDING,
    AttentionBlock,
    DecoderModel,
)
from engine.models.gemma3 import Gemma3DecoderLayer
from engine.runner import fused_hybrid
from kernels import step_weights
from kernels.fused_decode_cuda import Shapes
from kernels.fused_shapes import ACTIVATIONS
from kernels.fused_step_cuda import step_unsupported


def unsupported_reason(model: DecoderModel, step: bool = False) -> str | None:
    """Why `model` can't take the fused path (with `step`, the one-launch step: it takes
    any rotation table, q/k norm and hybrids too), or None."""
    cfg = model.config
    if model.ops.name != "mlx":
        return "needs the MLX backend"
    kinds = {cfg.layer_type(i) for i in range(cfg.num_layers)}
    if kinds != {FULL} and not (step and (kinds == {FULL, LINEAR} or LINEAR not in kinds)):
        return (
            "only full-attention layers (and sliding-window or Gated DeltaNet ones in the "
            "one-launch step)"
        )
    for feature, present in (
        ("gated attention", cfg.attn_output_gate),
        ("q/k norm", cfg.qk_norm),
        ("partial rotary embeddings", cfg.rope_dims != cfg.head_dim),
    ):
        if present and not step:
            return f"{feature} is fused in the one-launch step only"
    features = model.unfused_features()
    if step:
        features = [f for f in features if f not in _step_features(model)]
    if features:
        return f"{', '.join(features)} not fused"
    attention = [
        layer for i, layer in enumerate(model.layers) if cfg.layer_type(i) in (FULL, SLIDING)
    ]
    if not all(isinstance(layer.mixer, AttentionBlock) for layer in attention):
        return "unknown mixer"
    if reason := fused_hybrid.mixers_unsupported(model):
        return reason
    return model_shapes(model).check()


def _step_features(model: DecoderModel) -> set[str]:
    """The features of `unfused_features` the one-launch step computes for this model."""
    cfg = model.config
    fused = {f"the {act} activation" for act in ACTIVATIONS}
    fused |= {"an attention scale other than head_dim ** -0.5", "embedding scale"}
    fused.add("norm offsets")  # added at load: the step reads 1 + w as stored
    if rope_tables(model) is not None:
        fused.add("scaled rope")
    if model.layer_class is Gemma3DecoderLayer:  # its sandwich norms
        fused.add("extra norms around the blocks")
    if cfg.hidden_act not in ACTIVATIONS:
        fused.discard(f"the {cfg.hidden_act} activation")
    return fused


def rope_table(model: DecoderModel) -> np.ndarray | None:
    """The inverse frequencies [rope_dims / 2] (float32) every attention layer rotates by,
    if one table says it all (the five kernels' rotation); else None."""
    tables = rope_tables(model)
    if tables is None:
        return None
    rotating = [t for t, layer in zip(tables, model.layers, strict=True) if _rope(layer)]
    if any(not np.array_equal(t, rotating[0]) for t in rotating):
        return None
    return rotating[0]


def _rope(layer: Any) -> Any:
    return getattr(layer.mixer, "rope", None)


def rope_tables(model: DecoderModel) -> np.ndarray | None:
    """Each layer's inverse frequencies [num_layers, rope_dims / 2] (float32; zeros for a
    layer that rotates nothing), if a table says all a rotation does: no attention factor
    (YaRN's), no dynamic range; else None."""
    ropes = [_rope(layer) for layer in model.layers]
    present = [r for r in ropes if r is not None]
    if not present or any(r.mscale != 1.0 or r.max_positions for r in present):
        return None
    width = len(plain_inv_freq(present[0]))
    if any(len(plain_inv_freq(r)) != width for r in present):
        return None
    rows = [
        np.zeros(width) if r is None else r.inv_freq if r.inv_freq is not None
        else plain_inv_freq(r)
        for r in ropes
    ]  # fmt: skip
    return np.stack(rows).astype(np.float32)


def plain_inv_freq(rope: Any) -> np.ndarray:
    """theta ** (-2i / dims), i < dims / 2, as the rope computes it, in float64."""
    return 1.0 / rope.theta ** (np.arange(0, rope.dims, 2, dtype=np.float64) / rope.dims)


def step_unsupported_reason(model: DecoderModel) -> str | None:
    """Why the one-launch step can't take `model` (its features, its shapes, its weights as
    stored), or None."""
    shapes = model_shapes(model)
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


def model_shapes(model: DecoderModel) -> Shapes:
    cfg = model.config
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
        sliding=tuple(i for i in range(cfg.num_layers) if cfg.layer_type(i) == SLIDING),
        window=cfg.sliding_window if SLIDING in cfg.layer_types else 0,
        sandwich=model.layer_class is Gemma3DecoderLayer,
        act=cfg.hidden_act,
        embed_scale=cfg.embed_scale,
        attn_scale=cfg.query_pre_attn_scalar**-0.5 if cfg.query_pre_attn_scalar else 0.0,
        rope_per_layer=rope_table(model) is None,
    )


def step_norms(model: DecoderModel, shapes: Shapes) -> list[Any]:
    """The one-launch step's float32 norm inputs (kernels/fused_step_cuda.py's _NORMS): each
    layer's input norm and its MLP's (Gemma's pre_ffw_norm: its post_norm follows the
    attention), the final norm, the rotation's inverse frequencies (each layer's table, or
    the one they share), q_norm and k_norm, and the sandwich norms after attention and MLP
    (one element where a model has none)."""
    layers = model.layers
    one = mx.zeros((1,), dtype=mx.float32)

    def per_layer(name: str) -> Any:
        return mx.stack([getattr(layer, name).astype(mx.float32) for layer in layers])

    def per_mixer(name: str) -> Any:  # zeros for a hybrid's linear layers, which read none
        none = mx.zeros((model.config.head_dim,), dtype=mx.float32)
        return mx.stack([
            w.astype(mx.float32) if (w := getattr(layer.mixer, name, None)) is not None else none
            for layer in layers
        ])  # fmt: skip

    tables = rope_tables(model) if shapes.rope_per_layer else rope_table(model)
    if tables is None:
        raise ValueError("fused step: a rotation no table says")
    norms = [
        per_layer("input_norm"),
        per_layer("pre_ffw_norm" if shapes.sandwich else "post_norm"),
        model.norm.astype(mx.float32),
        mx.array(tables),
        *((per_mixer("q_norm"), per_mixer("k_norm")) if shapes.qk_norm else (one, one)),
        *((per_layer("post_norm"), per_layer("post_ffw_norm")) if shapes.sandwich else (one, one)),
    ]
    mx.eval(*norms)
    return norms
