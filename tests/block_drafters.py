"""Random-weight block drafter files (engine/block_drafter.py's format) for any target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from engine.drafter_file import FORMAT, VERSION


def drafter_tensors(
    cfg: Any, layers: int = 1, intermediate: int = 32, vocab: int | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Weights shaped for target config `cfg`: `vocab` draft ids (None: all of them)."""
    rng = np.random.default_rng(seed)
    D, Dh = cfg.hidden_size, cfg.head_dim
    q_out, kv_out = cfg.num_heads * Dh, cfg.num_kv_heads * Dh

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32)

    ids = np.arange(cfg.vocab_size) if vocab is None else rng.choice(cfg.vocab_size, vocab, False)
    tensors = {
        "fc.weight": mat(D, D),
        "hidden_norm.weight": norm(),
        "mask_embedding": rng.standard_normal(D).astype(np.float32),
        "final_norm.weight": norm(),
        "vocab": np.sort(ids).astype(np.int32),
    }
    F = intermediate
    for i in range(layers):
        shapes = {
            "q_proj": (q_out, D),
            "k_proj": (kv_out, D),
            "v_proj": (kv_out, D),
            "o_proj": (D, q_out),
            "gate_proj": (F, D),
            "up_proj": (F, D),
            "down_proj": (D, F),
        }
        for name, (rows, cols) in shapes.items():
            tensors[f"layers.{i}.{name}.weight"] = mat(rows, cols)
        tensors[f"layers.{i}.input_norm.weight"] = norm()
        tensors[f"layers.{i}.post_norm.weight"] = norm()
    return tensors


def drafter_metadata(cfg: Any, signature: str, layers: int, intermediate: int, block: int) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "target": "a test target",
        "target_check": signature,
        "block": str(block),
        "layers": str(layers),
        "heads": str(cfg.num_heads),
        "kv_heads": str(cfg.num_kv_heads),
        "head_dim": str(cfg.head_dim),
        "intermediate": str(intermediate),
        "rope_base": str(cfg.rope_theta),
        "rms_eps": str(cfg.rms_norm_eps),
    }


def write_drafter(
    path: Path,
    cfg: Any,
    signature: str,
    *,
    layers: int = 1,
    intermediate: int = 32,
    block: int = 8,
    vocab: int | None = None,
    seed: int = 0,
    tensors: dict[str, np.ndarray] | None = None,
    metadata: dict[str, str] | None = None,
) -> Path:
    tensors = (
        tensors if tensors is not None else drafter_tensors(cfg, layers, intermediate, vocab, seed)
    )
    meta = drafter_metadata(cfg, signature, layers, intermediate, block) | (metadata or {})
    mx.save_safetensors(str(path), {k: mx.array(v) for k, v in tensors.items()}, meta)
    return path
