"""What a GGUF -> MLX directory conversion (engine/convert.py) writes per family, beyond
the Llama form every one starts from: the config.json keys transformers and mlx-lm read
(mlx-lm's `qwen3` and `gemma3_text` models), the offset Hugging Face norms carry, and what
a family's directory cannot say (refused by name).

- Qwen3: Llama's keys with q/k norms (per-head RMSNorm weights, as the GGUF holds them) and
  `head_dim`; llama.cpp writes its Q/K rows as they are (NEOX rope), so nothing is permuted.
- Qwen3.5 (the hybrid): engine/convert_hybrid.py.
- Gemma 3: `gemma3_text` keys (a local rope base for the sliding layers, the window, one
  sliding-window pattern, query_pre_attn_scalar); HF norms are zero-centred (x * (1 + w))
  where llama.cpp's converter added the 1, so each norm weight is written minus 1.
"""

from __future__ import annotations

from typing import Any

from engine.convert_hybrid import hybrid_config, hybrid_tensors
from engine.models.base import FULL, SLIDING, ModelConfig

# norms as Hugging Face stores them: y = norm(x) * (offset + w)
HF_NORM_OFFSET = {"gemma3": 1.0}


def family_config(cfg: ModelConfig) -> tuple[dict[str, Any], str | None]:
    """(config.json keys beyond the Llama ones, or replacing them; why the family's
    directory cannot hold this file, or None)."""
    if cfg.family == "llama":
        return {}, None
    if cfg.family == "qwen3":
        if cfg.sliding_window:
            return {}, f"a sliding window of {cfg.sliding_window} has no mlx-lm Qwen3 form"
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, None
    if cfg.family == "gemma3":
        pattern = _pattern(cfg)
        if pattern is None:
            return {}, f"layer types {cfg.layer_types} follow no sliding-window pattern"
        return {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "hidden_activation": "gelu_pytorch_tanh",
            "rope_local_base_freq": float(cfg.rope_local_theta or 10000.0),
            "sliding_window": cfg.sliding_window,
            "sliding_window_pattern": pattern,
            "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
        }, None
    if cfg.family == "qwen3_5":
        return hybrid_config(cfg)
    return {}, f"no directory form for the {cfg.family!r} family"


def family_tensors(cfg: ModelConfig, tensors: dict[str, Any]) -> dict[str, Any]:
    """The tensors as the family's directory holds them (the hybrid's: engine/convert_hybrid.py)."""
    return hybrid_tensors(cfg, tensors) if cfg.family == "qwen3_5" else tensors


def _pattern(cfg: ModelConfig) -> int | None:
    """The n of "every n-th layer global" the layer types follow (mlx-lm's one pattern)."""
    types = tuple(cfg.layer_types) or tuple(FULL for _ in range(cfg.num_layers))
    if not cfg.sliding_window or SLIDING not in types:
        return 1 if all(t == FULL for t in types) else None
    globals_at = [i for i, t in enumerate(types) if t == FULL]
    n = globals_at[0] + 1 if globals_at else len(types) + 1
    expected = tuple(SLIDING if (i + 1) % n else FULL for i in range(len(types)))
    return n if expected == types else None
