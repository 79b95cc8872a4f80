"""Model families, one file each, named after the Hugging Face model_type."""

from __future__ import annotations

from types import ModuleType

from engine.models import gemma3, llama, qwen2, qwen3, qwen3_5

FAMILIES: tuple[ModuleType, ...] = (llama, qwen2, qwen3, qwen3_5, gemma3)

# GGUF architectures of a family implemented here whose GGUF layout is not mapped onto it
_UNMAPPED_GGUF = {
    arch: (
        f"GGUF architecture {arch!r} ({name}) is not mapped: beside its Gated DeltaNet layers "
        "it has mixture-of-experts MLPs (llama.cpp's ffn_*_exps), which the engine does not "
        "implement; a dense Qwen3.5 GGUF ('qwen35') or the Hugging Face or MLX directory of a "
        "dense model loads instead"
    )
    for arch, name in (("qwen3next", "Qwen3-Next"), ("qwen35moe", "Qwen3.5-MoE"))
}


def family_for_hf(model_type: str) -> ModuleType | None:
    return next((m for m in FAMILIES if model_type in m.HF_MODEL_TYPES), None)


def family_for_gguf(arch: str) -> ModuleType | None:
    return next((m for m in FAMILIES if arch in m.GGUF_ARCHITECTURES), None)


def unmapped_gguf_reason(arch: str) -> str | None:
    """Why a GGUF architecture of an implemented family is refused, or None."""
    return _UNMAPPED_GGUF.get(arch)
