"""Decode's memory-bandwidth limit: the bytes one decode step must read, and each engine's
decode speed as a fraction of what the memory could feed (issue 15, item 6).

A step reads every weight once (the embedding table one row, unless it is also the LM
head), each attention layer's K and V rows (a sliding layer's up to its window) and each
Gated DeltaNet layer's recurrent state (read and written). Weights count as the GGUF
stores them, the least any engine must read, so one denominator serves every engine; K/V
rows count 2 bytes a value (float16 / bfloat16, as all three engines keep them) and the
recurrent state 4 (float32). The fraction is tok/s * bytes / bandwidth.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.models.base import FULL, LINEAR, SLIDING, ModelConfig

H200_BYTES_PER_S = 4.8e12  # NVIDIA's figure for the H200's HBM3e
KV_BYTES = 2
STATE_BYTES = 4


def weight_bytes(gguf: Path) -> int:
    """The bytes of the weights one decode step reads."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(gguf).tensors}
    total = sum(int(t.n_bytes) for t in tensors.values())
    embed = tensors.get("token_embd.weight")
    if embed is not None and "output.weight" in tensors:  # untied: one row of the table
        rows = int(embed.shape[-1])  # ggml's shape is [columns, rows]
        total -= int(embed.n_bytes) - int(embed.n_bytes) // rows
    return total


def state_bytes(cfg: ModelConfig, context: int) -> int:
    """The K/V rows and recurrent states one step reads at `context` tokens."""
    total = 0
    for i in range(cfg.num_layers):
        kind = cfg.layer_type(i)
        if kind in (FULL, SLIDING):
            keys = min(context, cfg.sliding_window) if kind == SLIDING else context
            total += 2 * cfg.num_kv_heads * cfg.head_dim * keys * KV_BYTES
        elif kind == LINEAR:
            values = cfg.linear_num_value_heads * cfg.linear_value_head_dim
            total += 2 * values * cfg.linear_key_head_dim * STATE_BYTES
    return total


def decode_roofline(
    gguf: Path, cfg: ModelConfig, decode: dict[str, dict[int, float]], bandwidth: float
) -> dict[str, Any]:
    """Bytes a step reads at each context, and every engine's decode tok/s (`decode`: name
    -> context -> tok/s) as a fraction of bandwidth / bytes."""
    weights = weight_bytes(gguf)
    contexts = sorted({c for figures in decode.values() for c in figures})
    step_bytes = {c: weights + state_bytes(cfg, c) for c in contexts}
    return {
        "bandwidth_bytes_per_s": bandwidth,
        "weight_bytes": weights,
        "step_bytes": step_bytes,
        "limit_tok_s": {c: bandwidth / b for c, b in step_bytes.items()},
        "fraction": {
            name: {c: tok_s * step_bytes[c] / bandwidth for c, tok_s in figures.items()}
            for name, figures in decode.items()
        },
    }
