"""Model families, one file each, named after the Hugging Face model_type."""

from __future__ import annotations

from types import ModuleType

from engine.models import llama, qwen3


def families() -> list[ModuleType]:
    mods: list[ModuleType] = [llama, qwen3]
    try:
        from engine.models import qwen3_5  # type: ignore[attr-defined,unused-ignore]

        mods.append(qwen3_5)
    except ImportError:
        pass
    return mods


def family_for_hf(model_type: str) -> ModuleType | None:
    return next((m for m in families() if model_type in m.HF_MODEL_TYPES), None)


def family_for_gguf(arch: str) -> ModuleType | None:
    return next((m for m in families() if arch in m.GGUF_ARCHITECTURES), None)
