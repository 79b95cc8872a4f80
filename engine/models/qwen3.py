"""Qwen3 dense: the Llama layout plus RMSNorm on each head's queries and keys before
RoPE (Qwen3 technical report, 2025). Reuses the Llama builder; layers slide only with
`use_sliding_window`, from `max_window_layers` on (transformers' Qwen3Config)."""

from __future__ import annotations

from typing import Any

from engine.models import llama
from engine.models.base import DecoderModel, ModelConfig, Weights
from kernels.ops import Ops

HF_MODEL_TYPES = ("qwen3",)
GGUF_ARCHITECTURES = ("qwen3",)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    # Qwen3's attention_bias also puts a bias on o_proj, which the attention block lacks
    llama.refuse_switches(cfg, "qwen3", {"attention_bias": False, "hidden_act": "silu"})
    llama.refuse_partial_rotary(cfg, "qwen3")
    layer_types, window = llama.qwen_layer_types(cfg)
    return llama.config_from_hf(
        cfg, family="qwen3", qk_norm=True, layer_types=layer_types, sliding_window=window
    )


def config_from_gguf(meta: dict[str, Any], arch: str) -> ModelConfig:
    return llama.config_from_gguf(meta, arch, family="qwen3")


def build(ops: Ops, cfg: ModelConfig, weights: Weights) -> DecoderModel:
    return llama.build(ops, cfg, weights)
