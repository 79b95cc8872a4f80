"""An independent float64 NumPy forward of the tiny models, written from Hugging Face
transformers' modeling files (llama, mistral, qwen2, qwen3, gemma3) and
modeling_rope_utils.py, over a `TinySpec`'s HF-named weights. It shares no code with
engine/: the engine's families are checked against it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tests.tiny_models import TinySpec

GEMMA_TYPES = ("gemma3_text", "gemma3")


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float, offset: float = 0.0) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (offset + w)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def inv_frequencies(c: dict, params: dict, dim: int) -> tuple[np.ndarray, float]:
    """modeling_rope_utils' ROPE_INIT_FUNCTIONS for one rope dict: (inv_freq, attention
    factor); `dynamic` is the default rope within max_position_embeddings."""
    base = float(params.get("rope_theta") or c.get("rope_theta") or 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if kind in ("default", "dynamic"):
        return inv_freq, 1.0
    factor = float(params["factor"])
    if kind == "linear":
        return inv_freq / factor, 1.0
    original = params.get("original_max_position_embeddings") or c["max_position_embeddings"]
    if kind == "llama3":
        low, high = params["low_freq_factor"], params["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < original / high) & ~(wavelen > original / low)
        return np.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        attention = params.get("attention_factor") or 0.1 * math.log(factor) + 1.0
        fast, slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

        def dim_of(rotations: float) -> float:
            return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        lo, hi = max(math.floor(dim_of(fast)), 0), min(math.ceil(dim_of(slow)), dim - 1)
        ramp = np.clip((np.arange(dim // 2) - lo) / ((hi - lo) or 0.001), 0, 1)
        keep = 1 - ramp
        return inv_freq / factor * (1 - keep) + inv_freq * keep, float(attention)
    raise ValueError(f"the reference has no rope type {kind!r}")


def rope_rotate_half(x: np.ndarray, inv_freq: np.ndarray, attention: float = 1.0) -> np.ndarray:
    """HF's apply_rotary_pos_emb (RoFormer, arXiv:2104.09864) at positions 0..L-1.
    x: [heads, L, hd]; cos and sin carry the attention factor."""
    _, L, hd = x.shape
    angles = np.arange(L, dtype=np.float64)[:, None] * inv_freq[None, :]  # [L, hd/2]
    cos = np.cos(np.concatenate([angles, angles], axis=-1)) * attention  # [L, hd]
    sin = np.sin(np.concatenate([angles, angles], axis=-1)) * attention
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin


def layer_windows(c: dict) -> list[int]:
    """Each layer's sliding window (0: full attention), as each HF config defines it."""
    n, model_type = c["num_hidden_layers"], c["model_type"]
    window = c.get("sliding_window") or 0
    if model_type in GEMMA_TYPES:
        types = c.get("layer_types") or [
            "sliding_attention" if (i + 1) % c.get("sliding_window_pattern", 6) else "full"
            for i in range(n)
        ]
        return [window if t == "sliding_attention" else 0 for t in types]
    if model_type == "mistral":
        return [window] * n
    if model_type in ("qwen2", "qwen3") and c.get("use_sliding_window"):
        return [window if i >= c["max_window_layers"] else 0 for i in range(n)]
    return [0] * n


def layer_ropes(c: dict, windows: list[int]) -> list[tuple[np.ndarray, float]]:
    dim = c["head_dim"]
    params = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if c["model_type"] not in GEMMA_TYPES:
        return [inv_frequencies(c, params, dim)] * len(windows)
    full = {"rope_theta": c["rope_theta"], **(c.get("rope_scaling") or {})}
    local = {"rope_theta": c["rope_local_base_freq"]}
    return [inv_frequencies(c, local if w else full, dim) for w in windows]


def _project(w: dict, name: str, h: np.ndarray, heads: int, hd: int) -> np.ndarray:
    """[heads, L, hd] of one projection, with its bias where the model has one (Qwen2)."""
    y = h @ w[f"{name}.weight"].T
    if f"{name}.bias" in w:
        y = y + w[f"{name}.bias"]
    return y.reshape(len(h), heads, hd).transpose(1, 0, 2)


def reference_forward(spec: TinySpec, token_ids: list[int]) -> np.ndarray:
    """Logits [L, vocab] in float64 for `token_ids` at positions 0..L-1."""
    c = spec.config
    w = {k: v.astype(np.float64) for k, v in spec.weights.items()}
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]
    gemma = c["model_type"] in GEMMA_TYPES
    offset = 1.0 if gemma else 0.0  # Gemma3RMSNorm: x * (1 + w)
    qk_norm = gemma or c["model_type"] == "qwen3"
    scale = c["query_pre_attn_scalar"] ** -0.5 if gemma else hd**-0.5
    projections = (("q_proj", H), ("k_proj", KV), ("v_proj", KV))
    windows = layer_windows(c)
    ropes = layer_ropes(c, windows)
    L = len(token_ids)
    q_pos, k_pos = np.arange(L)[:, None], np.arange(L)[None, :]

    x = w["model.embed_tokens.weight"][np.asarray(token_ids)]  # [L, D]
    if gemma:
        x = x * c["hidden_size"] ** 0.5
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."

        h = rms_norm(x, w[p + "input_layernorm.weight"], eps, offset)
        q, k, v = (_project(w, f"{p}self_attn.{n}", h, heads, hd) for n, heads in projections)
        if qk_norm:  # per-head RMSNorm of q and k, before rope
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps, offset)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps, offset)
        q, k = rope_rotate_half(q, *ropes[i]), rope_rotate_half(k, *ropes[i])
        visible = k_pos <= q_pos
        if windows[i]:  # masking_utils.sliding_window_overlay: kv_idx > q_idx - window
            visible &= k_pos > q_pos - windows[i]
        heads = []
        for head in range(H):
            kv = head // (H // KV)
            scores = np.where(visible, q[head] @ k[kv].T * scale, -np.inf)  # [L, L]
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            heads.append(probs / probs.sum(axis=-1, keepdims=True) @ v[kv])  # [L, hd]
        attn = np.concatenate(heads, axis=-1) @ w[p + "self_attn.o_proj.weight"].T
        if gemma:
            x = x + rms_norm(attn, w[p + "post_attention_layernorm.weight"], eps, offset)
            h = rms_norm(x, w[p + "pre_feedforward_layernorm.weight"], eps, offset)
        else:
            x = x + attn
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        act = gelu_tanh(gate) if gemma else gate / (1.0 + np.exp(-gate))
        mlp = (act * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        if gemma:
            mlp = rms_norm(mlp, w[p + "post_feedforward_layernorm.weight"], eps, offset)
        x = x + mlp
    x = rms_norm(x, w["model.norm.weight"], eps, offset)
    head_w = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head_w.T
