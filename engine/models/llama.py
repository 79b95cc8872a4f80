"""Llama family (SmolLM2, Llama 3 style; Mistral-style sliding window): GQA attention,
RoPE, SwiGLU MLP, RMSNorm, optionally tied embeddings. (Touvron et al. 2023)"""

from __future__ import annotations

from typing import Any

from engine.models.base import FULL, SLIDING, AttentionBlock, DecoderModel, ModelConfig, Weights
from kernels.ops import Ops

HF_MODEL_TYPES = ("llama", "mistral")
GGUF_ARCHITECTURES = ("llama",)


def config_from_hf(cfg: dict[str, Any], family: str = "llama", **overrides: Any) -> ModelConfig:
    H = int(cfg["num_attention_heads"])
    D = int(cfg["hidden_size"])
    window = int(cfg.get("sliding_window") or 0)
    layer_types = tuple(cfg.get("layer_types") or ())
    if window and not layer_types and family == "llama":
        layer_types = tuple([SLIDING] * int(cfg["num_hidden_layers"]))
    if not window:
        layer_types = tuple(FULL if t == SLIDING else t for t in layer_types)
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
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        context_length=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=window,
        layer_types=layer_types,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def config_from_gguf(meta: dict[str, Any], arch: str, family: str = "llama") -> ModelConfig:
    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        return value.item() if hasattr(value, "item") else value

    D = int(get("embedding_length"))
    H = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", 0) or D // H)
    return ModelConfig(
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
        # llama.cpp's converter permutes Q/K rows for its interleaved rope
        rope_traditional=arch == "llama",
        rotary_dim=int(get("rope.dimension_count", 0) or 0),
        context_length=int(get("context_length", 4096)),
        qk_norm=family == "qwen3",
    )


def build(ops: Ops, cfg: ModelConfig, weights: Weights) -> DecoderModel:
    mixers = [
        AttentionBlock(ops, cfg, weights, f"model.layers.{i}.self_attn")
        for i in range(cfg.num_layers)
    ]
    return DecoderModel(ops, cfg, weights, mixers)
