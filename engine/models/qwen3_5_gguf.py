"""The Qwen3.5 GGUF layout (llama.cpp architecture `qwen35`) read onto the qwen3_5 family.

What llama.cpp's convert_hf_to_gguf.py (Qwen3_5TextModel) writes, and how it is read here:
- tensors: attn_qkv | attn_gate | ssm_beta | ssm_alpha are in_proj_qkv | z | b | a,
  ssm_conv1d (C, K) is conv1d squeezed, ssm_a is A = -exp(A_log), ssm_dt.bias is dt_bias,
  ssm_norm and ssm_out are the gated norm and out_proj, post_attention_norm the norm before
  the MLP; the attention layers keep attn_q ([query | gate] per head), attn_k, attn_v.
- every `*norm.weight` but the gated one is written as 1 + w: no norm offset.
- the value heads of v, z, b, a, A, dt_bias, the conv's v channels and out_proj's columns are
  reordered from HF's grouped order to ggml's tiled one (value head r * nk + g belongs to key
  head g); the model keeps that order and tiles its key heads (VALUE_HEAD_ORDER).
- rope: neox pairs on the first rope.dimension_count features; Qwen3.5's interleaved mrope
  (rope.dimension_sections) is plain rope on text positions, where all sections share one.
- layers: attention.recurrent_layers (or full_attention_interval), block_count counting the
  nextn_predict_layers MTP blocks at the end, which a forward does not use (HF drops mtp.*).
Qwen3.5-MoE (`qwen35moe`) and Qwen3-Next (`qwen3next`, mixture-of-experts only in llama.cpp)
are refused by engine.models: the engine has no expert layers.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from engine.models import llama, rope
from engine.models.base import FULL, LINEAR, ModelConfig, Weights

VALUE_HEAD_ORDER = "linear_value_head_order"  # ModelConfig.extra key: "tiled" for a GGUF
MTP_LAYERS = "mtp_layers"  # ModelConfig.extra key: MTP blocks after the decoder layers

LAYER_NAMES = {
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
    "post_attention_norm": "post_attention_layernorm",
}
LAYER_TENSORS = {  # whole names: ssm_a has no suffix, and holds A, not A_log
    "ssm_a": "linear_attn.A",
    "ssm_dt.bias": "linear_attn.dt_bias",
}
# group_count: key heads; time_step_rank: value heads; state_size: key head dim
_SSM_KEYS = ("conv_kernel", "state_size", "group_count", "time_step_rank", "inner_size")


def _array(value: Any) -> list[Any]:
    """A GGUF array key as a list (a one-element array reads as a scalar)."""
    return list(np.atleast_1d(np.asarray(value)).tolist())


def _required(get: Any, arch: str, key: str) -> int:
    value = get(key)
    if value is None:
        raise KeyError(f"{arch}.{key}")  # the loader says "incomplete qwen35 metadata (key)"
    return int(value)


def _layer_types(get: Any, num_layers: int, num_blocks: int) -> tuple[str, ...]:
    recurrent = get("attention.recurrent_layers")
    if recurrent is not None:
        flags = _array(recurrent)
        if len(flags) != num_blocks:
            raise ValueError(
                f"attention.recurrent_layers has {len(flags)} entries for {num_blocks} blocks"
            )
        return tuple(LINEAR if flag else FULL for flag in flags[:num_layers])
    interval = int(get("full_attention_interval", 4))
    if interval <= 0:
        raise ValueError(f"full_attention_interval {interval} is not positive")
    return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers))


def config_from_gguf(meta: dict[str, Any], arch: str) -> ModelConfig:
    get = llama.gguf_getter(meta, arch)
    scaling = rope.parse_gguf(get)
    if scaling is not None:
        raise ValueError(f"{arch} rope.scaling.type {scaling.rope_type!r} is not supported")
    sections = get("rope.dimension_sections")
    if sections is not None and any(int(s) for s in _array(sections)[3:]):
        # HF's Qwen3.5 rotates three sections (t, h, w), all one position on text
        raise ValueError(f"{arch} rope.dimension_sections {_array(sections)}: a fourth section")
    num_blocks = int(get("block_count"))
    num_mtp = int(get("nextn_predict_layers", 0) or 0)
    num_layers = num_blocks - num_mtp
    if num_layers <= 0:
        raise ValueError(f"{arch} has {num_blocks} blocks, {num_mtp} of them MTP")
    ssm = {key: _required(get, arch, f"ssm.{key}") for key in _SSM_KEYS}
    nv, inner = ssm["time_step_rank"], ssm["inner_size"]
    if nv <= 0 or inner % nv:
        raise ValueError(f"{arch} ssm.inner_size {inner} is not a multiple of {nv} value heads")
    return llama.config_from_gguf(
        meta,
        arch,
        family="qwen3_5",
        num_layers=num_layers,
        layer_types=_layer_types(get, num_layers, num_blocks),
        qk_norm=True,
        attn_output_gate=True,
        norm_offset=0.0,  # the converter wrote 1 + w
        linear_num_key_heads=ssm["group_count"],
        linear_num_value_heads=nv,
        linear_key_head_dim=ssm["state_size"],
        linear_value_head_dim=inner // nv,
        linear_conv_kernel_dim=ssm["conv_kernel"],
        extra={VALUE_HEAD_ORDER: "tiled", MTP_LAYERS: num_mtp},
    )


def skip_mtp_layers(cfg: ModelConfig, weights: Weights) -> None:
    """Mark a GGUF's MTP blocks (the blocks past the decoder layers) read: a plain forward
    does not use the multi-token-prediction head, as HF's does not."""
    if not cfg.extra.get(MTP_LAYERS):
        return
    for name in list(weights.tensors):
        m = re.match(r"(?:model\.layers|blk)\.(\d+)\.", name)
        if m and int(m.group(1)) >= cfg.num_layers:
            weights.skip(name)
