"""Qwen2 / Qwen2.5: the Llama layout with biases on the q, k and v projections (none on
o_proj), rope in the rotate-half form, layers sliding only with `use_sliding_window`, from
`max_window_layers` on (transformers' Qwen2Config / modeling_qwen2.py). Reuses the Llama
builder; GGUF files name the biases attn_q.bias, attn_k.bias, attn_v.bias."""

from __future__ import annotations

from typing import Any

from engine.models import llama
from engine.models.base import DecoderModel, ModelConfig, Weights
from kernels.ops import Ops

HF_MODEL_TYPES = ("qwen2",)
GGUF_ARCHITECTURES = ("qwen2",)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    llama.refuse_switches(cfg, "qwen2", {"hidden_act": "silu"})
    llama.refuse_partial_rotary(cfg, "qwen2")
    layer_types, window = llama.qwen_layer_types(cfg)
    return llama.config_from_hf(
        cfg,
        family="qwen2",
        attention_bias=True,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        layer_types=layer_types,
        sliding_window=window,
    )


def config_from_gguf(meta: dict[str, Any], arch: str) -> ModelConfig:
    return llama.config_from_gguf(meta, arch, family="qwen2", attention_bias=True)


def build(ops: Ops, cfg: ModelConfig, weights: Weights) -> DecoderModel:
    return llama.build(ops, cfg, weights)
