"""Tiny random-weight Qwen3.5 / Qwen3-Next hybrid checkpoints in each on-disk layout people
have, plus an independent float64 NumPy forward to check the engine against.

Layouts (`HYBRID_LAYOUTS`):
- "hf":   the official Qwen3.5 release: a vision-language config (model_type "qwen3_5" with a
          `text_config`), text tensors under `model.language_model.`, vision and MTP tensors
          beside them, zero-centred RMSNorm weights, conv1d (C, 1, K).
- "next": Qwen3-Next (dense MLP): `model.*`, fused in_proj_qkvz / in_proj_ba grouped per key
          head, `full_attention_interval` instead of `layer_types`.
- "mlx":  an mlx-lm / mlx-vlm conversion: `language_model.model.*`, conv1d (C, K, 1), norms
          stored as 1 + w (what their sanitize() writes), vision tower as `vision_tower.*`.
- "mlx4": the same, 4-bit: every 2-D tensor through mx.quantize (Linear and Embedding).

Every writer returns a `HybridSpec` whose `weights` are in canonical HF text-model naming and
layout (zero-centred norms, conv1d (C, 1, K), fused projections kept fused for "next") and
hold exactly the float32 values the written file decodes to. `reference_forward` follows HF
transformers' Qwen3NextForCausalLM / Qwen3_5ForCausalLM math.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from tests.tiny_models import BOS_ID, EOS_ID, VOCAB_SIZE, write_hf_tokenizer

HYBRID_LAYOUTS = ("hf", "next", "mlx", "mlx4")
FULL, LINEAR = "full_attention", "linear_attention"
ZERO_CENTRED_NORMS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)


@dataclass
class HybridSpec:
    layout: str
    config: dict  # the text model's config.json fields
    weights: dict[str, np.ndarray]  # canonical names and layout, float32, as the file decodes


def hybrid_text_config(tie: bool, **overrides: object) -> dict:
    config: dict = {
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": 1e-5,  # 1e-6 in the release; see test_hybrid.TOLERANCE
        "max_position_embeddings": 1024,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": tie,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }
    config.update(overrides)
    return config


def layer_types(config: dict) -> list[str]:
    if config.get("layer_types"):
        return list(config["layer_types"])
    n = config["full_attention_interval"]
    return [FULL if (i + 1) % n == 0 else LINEAR for i in range(config["num_hidden_layers"])]


def rope_settings(config: dict) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from wherever this config keeps them."""
    rope = config.get("rope_parameters") or {}
    theta = config.get("rope_theta", rope.get("rope_theta"))
    factor = config.get("partial_rotary_factor", rope.get("partial_rotary_factor"))
    return float(theta), float(factor)


def random_hybrid_weights(config: dict, fused: bool, seed: int) -> dict[str, np.ndarray]:
    """Projections std 0.2, zero-centred norms std 0.1, decays that keep some history."""
    rng = np.random.default_rng(seed)
    c = config
    D, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]

    def proj(*shape: int) -> np.ndarray:
        return (0.2 * rng.standard_normal(shape)).astype(np.float32)

    def zero_centred(n: int) -> np.ndarray:
        return (0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": proj(V, D)}
    for i, kind in enumerate(layer_types(c)):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = zero_centred(D)
        w[p + "post_attention_layernorm.weight"] = zero_centred(D)
        if kind == FULL:
            w[p + "self_attn.q_proj.weight"] = proj(2 * H * hd, D)  # [query | gate] per head
            w[p + "self_attn.k_proj.weight"] = proj(KV * hd, D)
            w[p + "self_attn.v_proj.weight"] = proj(KV * hd, D)
            w[p + "self_attn.o_proj.weight"] = proj(D, H * hd)
            w[p + "self_attn.q_norm.weight"] = zero_centred(hd)
            w[p + "self_attn.k_norm.weight"] = zero_centred(hd)
        else:
            a = p + "linear_attn."
            if fused:
                w[a + "in_proj_qkvz.weight"] = proj(2 * nk * dk + 2 * nv * dv, D)
                w[a + "in_proj_ba.weight"] = proj(2 * nv, D)
            else:
                w[a + "in_proj_qkv.weight"] = proj(2 * nk * dk + nv * dv, D)
                w[a + "in_proj_z.weight"] = proj(nv * dv, D)
                w[a + "in_proj_b.weight"] = proj(nv, D)
                w[a + "in_proj_a.weight"] = proj(nv, D)
            conv_dim = 2 * nk * dk + nv * dv
            w[a + "conv1d.weight"] = (0.4 * rng.standard_normal((conv_dim, 1, K))).astype(
                np.float32
            )
            w[a + "A_log"] = np.log(rng.uniform(0.05, 1.0, nv)).astype(np.float32)
            w[a + "dt_bias"] = (0.5 * rng.standard_normal(nv)).astype(np.float32)
            w[a + "norm.weight"] = (1.0 + 0.1 * rng.standard_normal(dv)).astype(np.float32)
            w[a + "out_proj.weight"] = proj(D, nv * dv)
        w[p + "mlp.gate_proj.weight"] = proj(F, D)
        w[p + "mlp.up_proj.weight"] = proj(F, D)
        w[p + "mlp.down_proj.weight"] = proj(D, F)
    w["model.norm.weight"] = zero_centred(D)
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = proj(V, D)
    return w


def _ignored_tensors(rng: np.random.Generator, vision_prefix: str) -> dict[str, np.ndarray]:
    """Vision-tower and multi-token-prediction tensors a text-only loader must skip."""
    return {
        f"{vision_prefix}patch_embed.proj.weight": rng.standard_normal((32, 3, 2, 4, 4)),
        f"{vision_prefix}blocks.0.attn.qkv.weight": rng.standard_normal((96, 32)),
        "mtp.fc.weight": rng.standard_normal((64, 128)),
        "mtp.layers.0.input_layernorm.weight": rng.standard_normal(64),
    }


def _save(directory: Path, arrays: dict[str, mx.array], config: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(directory / "model.safetensors"), arrays, {"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    write_hf_tokenizer(directory)


def _as_f32(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32), dtype=np.float32)


def _vl_config(text: dict, dtype: str) -> dict:
    """Qwen3.5's top-level vision-language config around the text config."""
    text = {**text, "model_type": "qwen3_5_text", "dtype": dtype}
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": text.pop("rope_theta"),
        "partial_rotary_factor": text.pop("partial_rotary_factor"),
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    }
    text["layer_types"] = layer_types(text)
    del text["full_attention_interval"]
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 32},
        "image_token_id": 0,
        "video_token_id": 0,
        "tie_word_embeddings": text["tie_word_embeddings"],
    }


def make_hybrid_dir(
    path: str | Path,
    layout: str = "hf",
    *,
    tie: bool = False,
    dtype: str = "float32",
    group_size: int = 32,
    seed: int = 0,
    **overrides: object,
) -> HybridSpec:
    """Write a tiny hybrid checkpoint directory in `layout` (see the module docstring)."""
    if layout not in HYBRID_LAYOUTS:
        raise ValueError(f"unknown hybrid layout {layout!r}")
    directory = Path(path)
    text = hybrid_text_config(tie, rope_theta=10000.0, partial_rotary_factor=0.5, **overrides)
    weights = random_hybrid_weights(text, fused=layout == "next", seed=seed)
    store = getattr(mx, dtype)
    rng = np.random.default_rng(seed + 1)

    arrays: dict[str, mx.array] = {}
    decoded: dict[str, np.ndarray] = {}
    if layout in ("hf", "next"):
        for name, w in weights.items():
            file_name = name
            if layout == "hf" and name.startswith("model."):
                file_name = "model.language_model." + name.removeprefix("model.")
            arrays[file_name] = mx.array(w).astype(store)
            decoded[name] = _as_f32(arrays[file_name])
        extra = _ignored_tensors(rng, "model.visual.")
        if layout == "next":  # Qwen3-Next has no vision tower, only the MTP head
            extra = {k: v for k, v in extra.items() if k.startswith("mtp.")}
        arrays |= {k: mx.array(v.astype(np.float32)).astype(store) for k, v in extra.items()}
        if layout == "hf":
            config = _vl_config(text, dtype)
        else:
            config = {
                "architectures": ["Qwen3NextForCausalLM"],
                "model_type": "qwen3_next",
                "num_experts": 0,  # dense MLP in every layer
                "num_experts_per_tok": 0,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
                **text,
                "dtype": dtype,
            }
    else:
        bits = 4 if layout == "mlx4" else None
        for name, w in weights.items():
            file_name = "language_model." + name
            value = w
            if name.endswith(ZERO_CENTRED_NORMS):
                value = (1.0 + w).astype(np.float32)  # mlx sanitize(): stored as 1 + w
            if name.endswith("conv1d.weight"):
                value = np.ascontiguousarray(np.moveaxis(w, 2, 1))  # (C, 1, K) -> (C, K, 1)
            stored = mx.array(value).astype(store)
            if bits is not None and stored.ndim == 2:
                wq, scales, biases = mx.quantize(stored, group_size, bits)
                base = file_name.removesuffix(".weight")
                arrays |= {file_name: wq, f"{base}.scales": scales, f"{base}.biases": biases}
                stored = mx.dequantize(
                    wq, scales.astype(mx.float32), biases.astype(mx.float32), group_size, bits
                )
            else:
                arrays[file_name] = stored
            exact = _as_f32(stored)
            if name.endswith(ZERO_CENTRED_NORMS):
                exact = exact - np.float32(1.0)  # exact: the stored values lie in [0.5, 2]
            if name.endswith("conv1d.weight"):
                exact = np.ascontiguousarray(np.moveaxis(exact, 2, 1))
            decoded[name] = exact
        # mlx-vlm keeps the vision tower (renamed); both converters drop the MTP head
        extra = _ignored_tensors(rng, "vision_tower.")
        extra = {k: v for k, v in extra.items() if k.startswith("vision_tower.")}
        arrays |= {k: mx.array(v.astype(np.float32)).astype(store) for k, v in extra.items()}
        config = _vl_config(text, dtype)
        if bits is not None:
            config["quantization"] = {"group_size": group_size, "bits": bits}
            config["quantization_config"] = dict(config["quantization"])
    _save(directory, arrays, config)
    return HybridSpec(layout, text, decoded)


# --- the reference forward (float64, one token at a time for the recurrent layers) ---


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def l2norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def partial_rope(x: np.ndarray, theta: float, rotary_dim: int) -> np.ndarray:
    """rotate_half rope on the first rotary_dim features, positions 0..L-1. x: [H, L, hd]."""
    _, L, _ = x.shape
    inv_freq = theta ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    angles = np.arange(L, dtype=np.float64)[:, None] * inv_freq[None, :]  # [L, rd/2]
    cos = np.cos(np.concatenate([angles, angles], axis=-1))  # [L, rd]
    sin = np.sin(np.concatenate([angles, angles], axis=-1))
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    return np.concatenate([rot * cos + rotated * sin, rest], axis=-1)


def _attention(c: dict, w: dict, p: str, h: np.ndarray) -> np.ndarray:
    L = h.shape[0]
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]
    theta, factor = rope_settings(c)
    qg = (h @ w[p + "q_proj.weight"].T).reshape(L, H, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(L, H * hd)
    k = (h @ w[p + "k_proj.weight"].T).reshape(L, KV, hd)
    v = (h @ w[p + "v_proj.weight"].T).reshape(L, KV, hd).transpose(1, 0, 2)
    q = rms_norm(q, 1.0 + w[p + "q_norm.weight"], eps).transpose(1, 0, 2)  # [H, L, hd]
    k = rms_norm(k, 1.0 + w[p + "k_norm.weight"], eps).transpose(1, 0, 2)
    rd = int(hd * factor)
    q, k = partial_rope(q, theta, rd), partial_rope(k, theta, rd)
    causal = np.tril(np.ones((L, L), dtype=bool))
    heads = []
    for head in range(H):
        kv = head // (H // KV)
        scores = np.where(causal, q[head] @ k[kv].T / np.sqrt(hd), -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        heads.append(probs / probs.sum(axis=-1, keepdims=True) @ v[kv])
    out = np.concatenate(heads, axis=-1) * sigmoid(gate)  # [L, H * hd]
    return out @ w[p + "o_proj.weight"].T


def _gated_deltanet(c: dict, w: dict, p: str, h: np.ndarray) -> np.ndarray:
    L = h.shape[0]
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    R = nv // nk
    if p + "in_proj_qkvz.weight" in w:  # HF fix_query_key_value_ordering, on activations
        qkvz = (h @ w[p + "in_proj_qkvz.weight"].T).reshape(L, nk, 2 * dk + 2 * R * dv)
        ba = (h @ w[p + "in_proj_ba.weight"].T).reshape(L, nk, 2 * R)
        q, k = qkvz[..., :dk], qkvz[..., dk : 2 * dk]
        v, z = qkvz[..., 2 * dk : 2 * dk + R * dv], qkvz[..., 2 * dk + R * dv :]
        b, a = ba[..., :R].reshape(L, nv), ba[..., R:].reshape(L, nv)
        mixed = np.concatenate([q.reshape(L, -1), k.reshape(L, -1), v.reshape(L, -1)], axis=-1)
        z = z.reshape(L, nv, dv)
    else:
        mixed = h @ w[p + "in_proj_qkv.weight"].T  # [L, 2 nk dk + nv dv]
        z = (h @ w[p + "in_proj_z.weight"].T).reshape(L, nv, dv)
        b, a = h @ w[p + "in_proj_b.weight"].T, h @ w[p + "in_proj_a.weight"].T
    conv_w = w[p + "conv1d.weight"][:, 0, :]  # (C, 1, K) -> [C, K]
    padded = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed], axis=0)
    conv = np.stack([np.sum(padded[t : t + K].T * conv_w, axis=-1) for t in range(L)])
    conv = silu(conv)
    key_dim = nk * dk
    q = l2norm(conv[:, :key_dim].reshape(L, nk, dk)) / np.sqrt(dk)
    k = l2norm(conv[:, key_dim : 2 * key_dim].reshape(L, nk, dk))
    v = conv[:, 2 * key_dim :].reshape(L, nv, dv)
    q, k = np.repeat(q, R, axis=1), np.repeat(k, R, axis=1)  # repeat_interleave over heads
    g = -np.exp(w[p + "A_log"]) * np.logaddexp(0.0, a + w[p + "dt_bias"])  # [L, nv]
    beta = sigmoid(b)
    S = np.zeros((nv, dk, dv))
    o = np.zeros((L, nv, dv))
    for t in range(L):
        for j in range(nv):
            S[j] *= np.exp(g[t, j])
            delta = (v[t, j] - S[j].T @ k[t, j]) * beta[t, j]
            S[j] += np.outer(k[t, j], delta)
            o[t, j] = S[j].T @ q[t, j]
    o = rms_norm(o, w[p + "norm.weight"], c["rms_norm_eps"]) * silu(z)
    return o.reshape(L, nv * dv) @ w[p + "out_proj.weight"].T


def reference_forward(spec: HybridSpec, token_ids: list[int]) -> np.ndarray:
    """Logits [L, vocab] in float64 for `token_ids` at positions 0..L-1."""
    c = spec.config
    w = {k: v.astype(np.float64) for k, v in spec.weights.items()}
    eps = c["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][np.asarray(token_ids)]  # [L, D]
    for i, kind in enumerate(layer_types(c)):
        p = f"model.layers.{i}."
        h = rms_norm(x, 1.0 + w[p + "input_layernorm.weight"], eps)
        if kind == FULL:
            x = x + _attention(c, w, p + "self_attn.", h)
        else:
            x = x + _gated_deltanet(c, w, p + "linear_attn.", h)
        h = rms_norm(x, 1.0 + w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, 1.0 + w["model.norm.weight"], eps)
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
