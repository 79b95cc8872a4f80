"""Llama family (SmolLM2, Llama 3.x; Mistral's sliding window): GQA attention, RoPE and its
scalings (engine.models.rope), SwiGLU MLP, RMSNorm, optionally tied embeddings.
(Touvron et al. 2023; Jiang et al., "Mistral 7B", 2023)

Config semantics follow Hugging Face transformers: Llama has no sliding window (a stray
`sliding_window` key is ignored, as LlamaConfig does), Mistral slides every layer when
`sliding_window` is set. Switches the family does not implement are refused by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.models import rope
from engine.models.base import (
    FULL,
    SLIDING,
    AttentionBlock,
    DecoderModel,
    ModelConfig,
    Weights,
    default_rope,
)
from kernels.ops import Ops

HF_MODEL_TYPES = ("llama", "mistral")
GGUF_ARCHITECTURES = ("llama",)

ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-frequency divisors (Llama 3.x GGUFs)


def refuse_switches(cfg: dict[str, Any], model_type: str, switches: dict[str, Any]) -> None:
    """Raise naming the first config switch set to a value other than the one implemented."""
    for key, implemented in switches.items():
        value = cfg.get(key)
        if value is not None and value != implemented:
            raise ValueError(f"{model_type} config {key}={value!r} is not supported")


def refuse_partial_rotary(cfg: dict[str, Any], model_type: str) -> None:
    params = cfg.get("rope_parameters") or {}
    factor = cfg.get("partial_rotary_factor") or params.get("partial_rotary_factor") or 1.0
    if float(factor) != 1.0:
        raise ValueError(f"{model_type} config partial_rotary_factor={factor} is not supported")


def hf_rope(cfg: dict[str, Any]) -> tuple[float, rope.RopeScaling | None]:
    """(rope_theta, scaling) from `rope_parameters` (newer configs) or `rope_scaling`."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"rope parameters {params!r} are not a mapping")
    theta = float(params.get("rope_theta") or cfg.get("rope_theta") or 10000.0)
    return theta, rope.parse_hf(cfg, params)


def qwen_layer_types(cfg: dict[str, Any]) -> tuple[tuple[str, ...], int]:
    """(layer types, window) as Qwen2/Qwen3 configs define them: no window unless
    `use_sliding_window`, and then only layers from `max_window_layers` on slide."""
    num_layers = int(cfg["num_hidden_layers"])
    window = int(cfg.get("sliding_window") or 0) if cfg.get("use_sliding_window") else 0
    layer_types = tuple(cfg.get("layer_types") or ())
    if not layer_types:
        first = int(cfg.get("max_window_layers", num_layers) or 0)
        layer_types = tuple(SLIDING if window and i >= first else FULL for i in range(num_layers))
    if not window:  # HF: a sliding layer without a window attends to everything
        layer_types = tuple(FULL if t == SLIDING else t for t in layer_types)
    return layer_types, window


def _llama_layer_types(cfg: dict[str, Any], model_type: str) -> tuple[tuple[str, ...], int]:
    num_layers = int(cfg["num_hidden_layers"])
    if model_type != "mistral":
        return tuple([FULL] * num_layers), 0
    window = int(cfg.get("sliding_window", 4096) or 0)  # MistralConfig's default is 4096
    return tuple([SLIDING if window else FULL] * num_layers), window


def config_from_hf(cfg: dict[str, Any], family: str = "llama", **overrides: Any) -> ModelConfig:
    model_type = str(cfg.get("model_type") or family)
    if family == "llama":
        refuse_switches(
            cfg,
            model_type,
            {"attention_bias": False, "mlp_bias": False, "hidden_act": "silu"},
        )
        refuse_partial_rotary(cfg, model_type)
        layer_types, window = _llama_layer_types(cfg, model_type)
        overrides = {"layer_types": layer_types, "sliding_window": window, **overrides}
    H = int(cfg["num_attention_heads"])
    D = int(cfg["hidden_size"])
    if "rope_scaling" in overrides:  # a family that reads its own rope parameters
        theta, scaling = float(cfg.get("rope_theta") or 10000.0), None
    else:
        theta, scaling = hf_rope(cfg)
    fields: dict[str, Any] = dict(
        family=family,
        hidden_size=D,
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=H,
        num_kv_heads=int(cfg.get("num_key_value_heads") or H),
        head_dim=int(cfg.get("head_dim") or D // H),
        intermediate_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_theta=theta,
        rope_scaling=scaling,
        context_length=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def gguf_getter(meta: dict[str, Any], arch: str) -> Any:
    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        is_scalar = hasattr(value, "item") and getattr(value, "size", 1) == 1
        return value.item() if is_scalar else value  # arrays (a per-layer pattern) as they are

    return get


def config_from_gguf(
    meta: dict[str, Any], arch: str, family: str = "llama", **overrides: Any
) -> ModelConfig:
    get = gguf_getter(meta, arch)
    D = int(get("embedding_length"))
    H = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", 0) or D // H)
    value_dim = int(get("attention.value_length", 0) or head_dim)
    if value_dim != head_dim:
        raise ValueError(f"attention.value_length {value_dim} != key_length {head_dim}")
    fields: dict[str, Any] = dict(
        family=family,
        hidden_size=D,
        num_layers=int(get("block_count")),
        num_heads=H,
        num_kv_heads=int(get("attention.head_count_kv", H)),
        head_dim=head_dim,
        intermediate_size=int(get("feed_forward_length")),
        vocab_size=int(get("vocab_size", 0) or len(meta["tokenizer.ggml.tokens"])),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=rope.parse_gguf(get),
        # llama.cpp's converter permutes Q/K rows for its interleaved rope
        rope_traditional=arch == "llama",
        rotary_dim=int(get("rope.dimension_count", 0) or 0),
        context_length=int(get("context_length", 4096)),
        qk_norm=family == "qwen3",
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def build(ops: Ops, cfg: ModelConfig, weights: Weights) -> DecoderModel:
    factors = None
    if weights.has(ROPE_FREQS):
        factors = np.array(weights.get(ROPE_FREQS, (cfg.rope_dims // 2,)), dtype=np.float64)
    layer_rope = default_rope(cfg, factors)
    mixers = [
        AttentionBlock(ops, cfg, weights, f"model.layers.{i}.self_attn", layer_rope)
        for i in range(cfg.num_layers)
    ]
    return DecoderModel(ops, cfg, weights, mixers)
