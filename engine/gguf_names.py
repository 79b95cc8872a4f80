"""GGUF tensor names (llama.cpp's `blk.N.attn_q.weight`) onto the canonical Hugging Face
names the families read, per family where llama.cpp reuses a name (Gemma 3's `ffn_norm`
is the norm before the MLP, Llama's is the norm after attention), and the check that a
build read every tensor a file holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from engine.errors import ModelLoadError
from engine.models.base import Weights

LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_SUFFIXES = "weight|bias|scales|biases"

# Tensors a reference implementation ignores as well: old HF checkpoints keep each layer's
# rotary inverse frequencies, which transformers recomputes from the config.
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def layer_names(family: ModuleType) -> dict[str, str]:
    return {**LAYER_NAMES, **getattr(family, "GGUF_LAYER_NAMES", {})}


def layer_tensors(family: ModuleType) -> dict[str, str]:
    """A family's whole per-layer tensor names (`ssm_a`, `ssm_dt.bias`), for the tensors whose
    GGUF suffix is not the canonical one or that have none."""
    return dict(getattr(family, "GGUF_LAYER_TENSORS", {}))


def renamer(family: ModuleType) -> Callable[[str], str]:
    """The canonical name of a GGUF tensor name for `family` (unknown names kept as they are,
    so a tensor nothing reads is still reported by name)."""
    names, whole = layer_names(family), layer_tensors(family)

    def rename(name: str) -> str:
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
        if m and m.group(2) in whole:
            return f"model.layers.{m.group(1)}.{whole[m.group(2)]}"
        m = re.fullmatch(rf"blk\.(\d+)\.(\w+)\.({_SUFFIXES})", name)
        if m and m.group(2) in names:
            return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"
        m = re.fullmatch(rf"(\w+)\.({_SUFFIXES})", name)
        if m and m.group(1) in GLOBAL_NAMES:
            return f"{GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
        return name

    return rename


def expected_names(family: ModuleType, num_layers: int) -> dict[str, str]:
    """GGUF name -> canonical name of every tensor a family may read, for messages about
    tensors a file lacks."""
    names = {f"{g}.{s}": f"{hf}.{s}" for g, hf in GLOBAL_NAMES.items() for s in ("weight",)}
    for i in range(num_layers):
        for g, hf in layer_names(family).items():
            for suffix in ("weight", "bias"):
                names[f"blk.{i}.{g}.{suffix}"] = f"model.layers.{i}.{hf}.{suffix}"
        for g, hf in layer_tensors(family).items():
            names[f"blk.{i}.{g}"] = f"model.layers.{i}.{hf}"
    return names


def check_consumed(weights: Weights, source: Path) -> None:
    """Refuse a load that left tensors unread: each is a feature the family does not
    implement (attention biases, extra norms...), and ignoring it gives plausible wrong text."""
    for name in list(weights.tensors):
        if _IGNORED.fullmatch(name):
            weights.skip(name)
    unused = weights.unused()
    if unused:
        shown = ", ".join(unused[:8]) + (f" and {len(unused) - 8} more" if len(unused) > 8 else "")
        raise ModelLoadError(
            source, f"{len(unused)} tensor(s) this model family does not use: {shown}"
        )
