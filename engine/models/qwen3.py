"""Qwen3 dense: the Llama layout plus RMSNorm on each head's queries and keys before
RoPE (Qwen3 technical report, 2025). Reuses the Llama builder."""

from __future__ import annotations

from typing import Any

from engine.models import llama
from engine.models.base import DecoderModel, ModelConfig, Weights
from kernels.ops import Ops

HF_MODEL_TYPES = ("qwen3",)
GGUF_ARCHITECTURES = ("qwen3",)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    return llama.config_from_hf(cfg, family="qwen3", qk_norm=True)


def config_from_gguf(meta: dict[str, Any], arch: str) -> ModelConfig:
    return llama.config_from_gguf(meta, arch, family="qwen3")


def build(ops: Ops, cfg: ModelConfig, weights: Weights) -> DecoderModel:
    return llama.build(ops, cfg, weights)
