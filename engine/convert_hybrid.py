"""A Qwen3.5 hybrid's GGUF (llama.cpp's `qwen35`, engine/models/qwen3_5_gguf.py) as the MLX
directory mlx-lm's `qwen3_5` model reads (engine/convert.py writes it; our loader reads it
back as an MLX conversion).

What llama.cpp's converter changed is put back, exactly where it can be:
- value heads: the GGUF keeps them in ggml's tiled order (value head r * nk + g belongs to
  key head g), HF and mlx-lm group them (g * R + r). The rows of v (in in_proj_qkv and the
  conv), z, b and a, the entries of A and dt_bias, and out_proj's columns move back by
  whole heads. A quantized out_proj moves its packed words and groups a head at a time
  (exact while a head's columns fill whole words and groups), otherwise it is written dense;
- A = -exp(A_log) becomes A_log = log(-A), in float32 (exp(log(x)) is within an ulp of x);
- the conv weight (C, K) becomes MLX's (C, K, 1), and the norms stay as the GGUF stores them,
  1 + w: mlx-lm's sanitize adds 1 only to checkpoints whose conv is not yet in MLX's form,
  and our loader reads the (C, K, 1) form the same way (engine/models/qwen3_5.py);
- every tensor is named under `language_model.` as mlx-lm's model holds it, so the
  quantization entries of matrices held otherwise name its modules.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from engine.models.base import FULL, LINEAR, ModelConfig
from engine.models.qwen3_5_gguf import VALUE_HEAD_ORDER
from kernels.quantized import QuantizedWeight, dequantize

PREFIX = "language_model."


def hybrid_config(cfg: ModelConfig) -> tuple[dict[str, Any], str | None]:
    """config.json's qwen3_5 keys, or why this file has no such form."""
    types = tuple(cfg.layer_types)
    full = [i for i, t in enumerate(types) if t == FULL]
    interval = full[0] + 1 if full else 0
    if not interval or types != tuple(
        FULL if (i + 1) % interval == 0 else LINEAR for i in range(len(types))
    ):
        return {}, f"layer types {types} follow no full_attention_interval"
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5",
        "linear_num_key_heads": cfg.linear_num_key_heads,
        "linear_num_value_heads": cfg.linear_num_value_heads,
        "linear_key_head_dim": cfg.linear_key_head_dim,
        "linear_value_head_dim": cfg.linear_value_head_dim,
        "linear_conv_kernel_dim": cfg.linear_conv_kernel_dim,
        "full_attention_interval": interval,
        "layer_types": list(types),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rope_dims / cfg.head_dim,
        },
    }, None


def hybrid_tensors(cfg: ModelConfig, tensors: dict[str, Any]) -> dict[str, Any]:
    """The GGUF's tensors in mlx-lm's qwen3_5 form, under its names."""
    nk, nv, dk, dv = (
        cfg.linear_num_key_heads, cfg.linear_num_value_heads,
        cfg.linear_key_head_dim, cfg.linear_value_head_dim,
    )  # fmt: skip
    R = nv // nk
    tiled = cfg.extra.get(VALUE_HEAD_ORDER) == "tiled"
    # grouped head h = g * R + r is tiled head r * nk + g
    heads = np.array([(h % R) * nk + h // R for h in range(nv)]) if tiled else np.arange(nv)
    rows = (heads[:, None] * dv + np.arange(dv)[None, :]).reshape(-1)  # a head's dv rows
    key = 2 * nk * dk
    qkv_rows = np.concatenate([np.arange(key), key + rows])
    out: dict[str, Any] = {}
    for name, value in tensors.items():
        part = name.rsplit("linear_attn.", 1)[-1] if ".linear_attn." in name else ""
        if part == "in_proj_qkv.weight":
            value = _take_rows(value, qkv_rows)
        elif part == "in_proj_z.weight":
            value = _take_rows(value, rows)
        elif part in ("in_proj_b.weight", "in_proj_a.weight", "dt_bias"):
            value = _take_rows(value, heads)
        elif part == "A":
            name = name.removesuffix(".A") + ".A_log"
            value = mx.log(-_dense(_take_rows(value, heads)))
        elif part == "conv1d.weight":
            value = _dense(_take_rows(value, qkv_rows))[:, :, None]
        elif part == "out_proj.weight":
            value = _take_columns(value, heads, dv)
        out[PREFIX + name] = value
    return out


def _dense(value: Any) -> mx.array:
    return mx.array(np.asarray(value, dtype=np.float32))


def _take_rows(value: Any, index: np.ndarray) -> Any:
    if isinstance(value, QuantizedWeight):
        idx = mx.array(index)
        return QuantizedWeight(
            value.packed[idx], value.scales[idx], value.biases[idx],
            value.group_size, value.bits, source=value.source, fma_only=value.fma_only,
        )  # fmt: skip
    return mx.array(value)[mx.array(index)]


def _take_columns(value: Any, heads: np.ndarray, width: int) -> Any:
    """The input columns of [out, heads * width], whole heads in `heads` order."""
    if isinstance(value, QuantizedWeight):
        words, groups = width * value.bits, width // value.group_size
        if words % 32 or width % value.group_size or not value.is_mlx_exact:
            return _take_columns(mx.array(dequantize(value)), heads, width)

        def blocks(a: Any, per_head: int) -> Any:
            return a.reshape(a.shape[0], len(heads), per_head)[:, mx.array(heads)].reshape(
                a.shape[0], -1
            )

        return QuantizedWeight(
            blocks(value.packed, words // 32), blocks(value.scales, groups),
            blocks(value.biases, groups), value.group_size, value.bits,
            source=value.source, fma_only=value.fma_only,
        )  # fmt: skip
    dense = mx.array(value)
    return dense.reshape(dense.shape[0], len(heads), width)[:, mx.array(heads)].reshape(
        dense.shape[0], -1
    )
