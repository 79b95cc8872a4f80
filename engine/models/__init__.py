"""Model families, one file each, named after the Hugging Face model_type."""

from __future__ import annotations

from types import ModuleType

from engine.models import llama, qwen3, qwen3_5

FAMILIES: tuple[ModuleType, ...] = (llama, qwen3, qwen3_5)


def family_for_hf(model_type: str) -> ModuleType | None:
    return next((m for m in FAMILIES if model_type in m.HF_MODEL_TYPES), None)


def family_for_gguf(arch: str) -> ModuleType | None:
    return next((m for m in FAMILIES if arch in m.GGUF_ARCHITECTURES), None)
