"""Gemma 3 text models (Gemma Team, "Gemma 3 Technical Report", 2025, arXiv:2503.19786):
five sliding-window layers to one global layer, sliding layers with their own rope base
(10000), global layers with rope_theta and its scaling; GeGLU MLP (GELU, tanh
approximation); RMSNorm before and after both the attention and the MLP; per-head q/k
RMSNorm; embeddings scaled by sqrt(hidden_size); attention scaled by
query_pre_attn_scalar ** -0.5; tied embeddings. Semantics follow transformers'
modeling_gemma3.py / configuration_gemma3.py (v5).

Norm weights: HF stores them zero-centred (y = norm(x) * (1 + w)); llama.cpp's converter
adds the 1 when writing a GGUF (its graph multiplies by the stored weight), so GGUF norms
take no offset.

Layer pattern and attention scale of a GGUF, as llama.cpp sets them for gemma3: layer i
slides unless (i + 1) % 6 == 0, and the scale is key_length ** -0.5 except for the 27B
model (62 layers), whose query_pre_attn_scalar is hidden_size / heads.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from engine.models import llama, rope
from engine.models.base import (
    FULL,
    SLIDING,
    AttentionBlock,
    DecoderLayer,
    DecoderModel,
    ModelConfig,
    Weights,
    default_rope,
    norm_weight,
    text_model_renamer,
)
from engine.models.rope import Rope
from kernels.ops import Array, Ops

HF_MODEL_TYPES = ("gemma3_text", "gemma3")
GGUF_ARCHITECTURES = ("gemma3",)

# llama.cpp's gemma3 names: ffn_norm is the norm before the MLP here, not after attention
GGUF_LAYER_NAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
SLIDING_WINDOW_PATTERN = 6  # transformers' and llama.cpp's default: every 6th layer global
LOCAL_ROPE_THETA = 10000.0

_DROPPED = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)
_RENAMED = (
    ("model.language_model.", "model."),  # Gemma3ForConditionalGeneration, transformers v5
    ("language_model.model.", "model."),  # ... transformers v4
    ("language_model.lm_head.", "lm_head."),
)


# the text model's canonical `model.*` / `lm_head.*` names; the vision tower are not read
canonical_name = text_model_renamer(_DROPPED, _RENAMED)


def pattern_layer_types(num_layers: int, pattern: int) -> tuple[str, ...]:
    return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(num_layers))


def _hf_ropes(cfg: dict[str, Any]) -> tuple[float, rope.RopeScaling | None, float]:
    """(global theta, global scaling, local theta): v5 nests rope_parameters by layer type;
    older configs have rope_theta, rope_scaling (global layers) and rope_local_base_freq."""
    params = cfg.get("rope_parameters") or {}
    if FULL in params or SLIDING in params:
        full = dict(params.get(FULL) or {})
        local = dict(params.get(SLIDING) or {})
    else:
        full = {**params, **(cfg.get("rope_scaling") or {})}
        local = {}
    full.setdefault("rope_theta", cfg.get("rope_theta") or 1_000_000.0)
    local.setdefault("rope_theta", cfg.get("rope_local_base_freq") or LOCAL_ROPE_THETA)
    if rope.parse_hf(cfg, local) is not None:
        raise ValueError(
            f"gemma3 sliding layers' rope_type {local.get('rope_type')!r} is not supported"
        )
    return float(full["rope_theta"]), rope.parse_hf(cfg, full), float(local["rope_theta"])


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    model_type = "gemma3"
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"{model_type} config hidden_activation={act!r} is not supported")
    llama.refuse_switches(
        cfg,
        model_type,
        {
            "final_logit_softcapping": None,
            "attn_logit_softcapping": None,
            "use_bidirectional_attention": False,
            "attention_bias": False,
        },
    )
    llama.refuse_partial_rotary(cfg, model_type)
    num_layers = int(cfg.get("num_hidden_layers", 26))
    pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
    layer_types = tuple(cfg.get("layer_types") or pattern_layer_types(num_layers, pattern))
    window = int(cfg.get("sliding_window", 4096) or 0)
    if not window:
        layer_types = tuple(FULL for _ in layer_types)
    theta, scaling, local_theta = _hf_ropes(cfg)
    D = int(cfg.get("hidden_size", 2304))
    H = int(cfg.get("num_attention_heads", 8))
    return ModelConfig(
        family="gemma3",
        hidden_size=D,
        num_layers=num_layers,
        num_heads=H,
        num_kv_heads=int(cfg.get("num_key_value_heads") or 4),
        head_dim=int(cfg.get("head_dim") or 256),
        intermediate_size=int(cfg.get("intermediate_size", 9216)),
        vocab_size=int(cfg.get("vocab_size", 262_208)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        rope_local_theta=local_theta,
        context_length=int(cfg.get("max_position_embeddings", 131_072)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        qk_norm=True,
        norm_offset=1.0,
        sliding_window=window,
        layer_types=layer_types,
        query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)),
        hidden_act="gelu_tanh",
        embed_scale=math.sqrt(D),
    )


def config_from_gguf(meta: dict[str, Any], arch: str) -> ModelConfig:
    get = llama.gguf_getter(meta, arch)
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if get(key) is not None:
            raise ValueError(f"gemma3 {key} is not supported")
    base = llama.config_from_gguf(meta, arch, family="gemma3", rope_traditional=False)
    window = int(get("attention.sliding_window", 0) or 0)
    layer_types = _gguf_layer_types(get("attention.sliding_window_pattern"), base.num_layers)
    scalar = base.head_dim
    if base.num_layers == 62:  # llama.cpp: Gemma 3 27B scales by hidden_size / heads
        scalar = base.hidden_size // base.num_heads
    return replace(
        base,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_local_theta=float(get("rope.freq_base_swa", LOCAL_ROPE_THETA)),
        qk_norm=True,
        sliding_window=window,
        layer_types=layer_types if window else (),
        query_pre_attn_scalar=float(scalar),
        hidden_act="gelu_tanh",
        embed_scale=math.sqrt(base.hidden_size),
        tie_word_embeddings=True,
    )


def _gguf_layer_types(pattern: Any, num_layers: int) -> tuple[str, ...]:
    """Newer converters state the pattern: an int, or a bool per layer (True: sliding);
    older files (the 270M one) state none, and llama.cpp uses 6."""
    if pattern is None:
        return pattern_layer_types(num_layers, SLIDING_WINDOW_PATTERN)
    if isinstance(pattern, int | float):
        return pattern_layer_types(num_layers, int(pattern))
    flags = [bool(f) for f in pattern]
    if len(flags) != num_layers:
        raise ValueError(
            f"attention.sliding_window_pattern names {len(flags)} of {num_layers} layers"
        )
    return tuple(SLIDING if f else FULL for f in flags)


class Gemma3DecoderLayer(DecoderLayer):
    """Sandwich norms: norm, block, norm, residual, for the attention and for the MLP."""

    def __init__(self, ops: Ops, cfg: ModelConfig, weights: Weights, i: int, mixer: Any):
        super().__init__(ops, cfg, weights, i, mixer)
        p, D = f"model.layers.{i}", cfg.hidden_size
        self.pre_ffw_norm = norm_weight(
            ops, cfg, weights.get(f"{p}.pre_feedforward_layernorm.weight", (D,))
        )
        self.post_ffw_norm = norm_weight(
            ops, cfg, weights.get(f"{p}.post_feedforward_layernorm.weight", (D,))
        )

    def __call__(self, x: Array, layer_state: Any, offset: int) -> Array:
        ops, eps = self.ops, self.cfg.rms_norm_eps
        attn = self.mixer(ops.rms_norm(x, self.input_norm, eps), layer_state, offset)
        h = x + ops.rms_norm(attn, self.post_norm, eps)  # post_norm: post_attention_layernorm
        mlp = self.mlp(ops.rms_norm(h, self.pre_ffw_norm, eps))
        return h + ops.rms_norm(mlp, self.post_ffw_norm, eps)


class Gemma3Model(DecoderModel):
    layer_class = Gemma3DecoderLayer


def build(ops: Ops, cfg: ModelConfig, weights: Weights) -> DecoderModel:
    global_rope = default_rope(cfg)
    local_rope = Rope(cfg.rope_dims, cfg.rope_local_theta or cfg.rope_theta, cfg.rope_traditional)
    mixers = [
        AttentionBlock(
            ops,
            cfg,
            weights,
            f"model.layers.{i}.self_attn",
            local_rope if cfg.layer_type(i) == SLIDING else global_rope,
        )
        for i in range(cfg.num_layers)
    ]
    return Gemma3Model(ops, cfg, weights, mixers)
