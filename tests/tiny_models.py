"""Tiny random-weight models in the exact on-disk formats a real download has, plus an
independent float64 NumPy forward to check the product's models against.

Every builder returns a `TinySpec` whose `weights` hold, in Hugging Face naming and
layout, exactly the float32 values the written file decodes to (after GGUF or MLX
dequantization and after undoing GGUF's rope permutation). `reference_forward(spec, ids)`
(tests/tiny_reference.py) is Hugging Face transformers' forward over those weights.
tests/tiny_families.py writes the other families (Qwen2, Gemma 3) and rope variants. Their
tokenizer is tests/tiny_tokenizer.py's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType

from tests.kquant_blocks import encode
from tests.tiny_reference import reference_forward
from tests.tiny_tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE, add_gguf_tokenizer, write_hf_tokenizer

__all__ = ["BOS_ID", "EOS_ID", "VOCAB_SIZE", "TinySpec", "reference_forward"]

# --- weights ---


@dataclass
class TinySpec:
    family: str  # "llama" | "qwen3"
    config: dict  # Hugging Face config.json style
    weights: dict[str, np.ndarray]  # HF names and layout, float32, as the file decodes


def tiny_config(family: str, tie: bool, **overrides: object) -> dict:
    config: dict = {
        "model_type": family,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        # Qwen3 decouples head_dim from hidden_size / heads (0.6B: 16 x 128 on 1024), so
        # the tiny Qwen3 does too, to catch code that derives one from the other.
        "head_dim": 32 if family == "qwen3" else 16,
        "intermediate_size": 128,
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": tie,
        "hidden_act": "silu",
        "attention_bias": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "rope_scaling": None,
        "torch_dtype": "float32",
    }
    if family == "llama" and overrides.get("sliding_window"):
        # a Llama layout with a sliding window is Mistral to transformers (LlamaConfig has none)
        config |= {"model_type": "mistral", "architectures": ["MistralForCausalLM"]}
    elif family == "llama":
        config |= {"architectures": ["LlamaForCausalLM"], "mlp_bias": False, "pretraining_tp": 1}
    elif family == "qwen3":
        config |= {
            "architectures": ["Qwen3ForCausalLM"],
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": 2,
        }
    else:
        raise ValueError(f"unknown tiny family {family!r}")
    config.update(overrides)
    return config


def random_weights(family: str, config: dict, seed: int) -> dict[str, np.ndarray]:
    """Projections with std 0.2 (so attention is far from uniform and context matters),
    norm weights around 1."""
    rng = np.random.default_rng(seed)
    D, F, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    H, KV, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]

    def proj(*shape: int) -> np.ndarray:
        return (0.2 * rng.standard_normal(shape)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": proj(V, D)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(D)
        w[p + "self_attn.q_proj.weight"] = proj(H * hd, D)
        w[p + "self_attn.k_proj.weight"] = proj(KV * hd, D)
        w[p + "self_attn.v_proj.weight"] = proj(KV * hd, D)
        w[p + "self_attn.o_proj.weight"] = proj(D, H * hd)
        if family == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(D)
        w[p + "mlp.gate_proj.weight"] = proj(F, D)
        w[p + "mlp.up_proj.weight"] = proj(F, D)
        w[p + "mlp.down_proj.weight"] = proj(D, F)
    w["model.norm.weight"] = norm(D)
    if not config["tie_word_embeddings"]:
        w["lm_head.weight"] = proj(V, D)
    return w


# --- GGUF (llama.cpp's convert_hf_to_gguf.py layout) ---

GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9}
# the K-quants as llama.cpp labels a file of mostly that type (enum llama_ftype)
FILE_TYPES |= {"Q2_K": 10, "Q3_K": 12, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18}


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"


def permute_for_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: interleave each head's two rotate_half
    halves so that llama.cpp's pairwise ("traditional") rope applies."""
    # [n_head * hd, D] -> [n_head, 2, hd/2, D] -> [n_head, hd/2, 2, D]
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def unpermute_for_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    # [n_head, hd/2, 2, D] -> [n_head, 2, hd/2, D]
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def make_llama_gguf(
    path: str | Path,
    *,
    qtype: str = "F32",
    embed_qtype: str | None = None,
    tie: bool = True,
    seed: int = 0,
    arch: str = "llama",
    omit: tuple[str, ...] = (),
    replace: dict[str, np.ndarray] | None = None,
    **config_overrides: object,
) -> TinySpec:
    """Write a tiny Llama GGUF; return the HF-layout weights it decodes to.

    `qtype` applies to every 2-D weight, `embed_qtype` (default: `qtype`) to token_embd;
    norms stay F32, as in llama.cpp's files. `arch`, `omit` (GGUF tensor names to leave
    out) and `replace` (GGUF name -> raw F32 array written as is) build broken files.
    """
    config = tiny_config("llama", tie, **config_overrides)
    weights = random_weights("llama", config, seed)
    H, KV = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("Tiny Llama")
    writer.add_type("model")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(H)
    writer.add_head_count_kv(KV)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_file_type(FILE_TYPES[qtype])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_gguf_tokenizer(writer)

    decoded: dict[str, np.ndarray] = {}
    for hf_name, w in weights.items():
        name = gguf_name(hf_name)
        n_head = H if "q_proj" in hf_name else KV if "k_proj" in hf_name else 0
        if n_head:
            w = permute_for_rope(w, n_head)
        kind = qtype if w.ndim == 2 else "F32"
        if hf_name == "model.embed_tokens.weight" and embed_qtype is not None:
            kind = embed_qtype
        raw_type = GGMLQuantizationType[kind]
        stored = encode(w, kind, seed + len(decoded))
        value = gguf.quants.dequantize(stored, raw_type).reshape(w.shape).astype(np.float32)
        decoded[hf_name] = unpermute_for_rope(value, n_head) if n_head else value
        if name in omit:
            continue
        if replace and name in replace:
            writer.add_tensor(name, replace[name].astype(np.float32))
        elif kind in ("F32", "F16"):
            writer.add_tensor(name, stored)
        else:
            writer.add_tensor(name, stored, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return TinySpec("llama", config, decoded)


# --- Hugging Face / MLX directories ---

QUANTIZED_SUFFIXES = ("_proj.weight", "embed_tokens.weight", "lm_head.weight")


def make_hf_dir(
    path: str | Path,
    family: str = "llama",
    *,
    bits: int | None = None,
    group_size: int = 32,
    shards: int = 1,
    tie: bool = False,
    seed: int = 0,
    dtype: str = "float32",
    **overrides: object,
) -> TinySpec:
    """Write a tiny HF-layout model directory (mlx-lm's layout when `bits` is set: every
    Linear and the embedding as `.weight` uint32 + `.scales` + `.biases`).

    `dtype` ("float32" | "float16" | "bfloat16") is the stored dtype of float tensors
    and of the quantization scales and biases, as in real downloads.
    """
    config = tiny_config(family, tie, **overrides)
    weights = random_weights(family, config, seed)
    return write_hf_dir(path, family, config, weights, bits, group_size, shards, dtype)


def write_hf_dir(
    path: str | Path,
    family: str,
    config: dict,
    weights: dict[str, np.ndarray],
    bits: int | None = None,
    group_size: int = 32,
    shards: int = 1,
    dtype: str = "float32",
) -> TinySpec:
    """`weights` (HF names) and `config` written as a model directory; see make_hf_dir."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    config["torch_dtype"] = dtype
    if bits is not None:
        config["quantization"] = {"group_size": group_size, "bits": bits}
        config["quantization_config"] = dict(config["quantization"])
    store_dtype = getattr(mx, dtype)

    arrays: dict[str, mx.array] = {}
    decoded: dict[str, np.ndarray] = {}
    for name, w in weights.items():
        value = mx.array(w).astype(store_dtype)
        if bits is not None and name.endswith(QUANTIZED_SUFFIXES):
            wq, scales, biases = mx.quantize(value, group_size, bits)
            base = name.removesuffix(".weight")
            arrays |= {name: wq, f"{base}.scales": scales, f"{base}.biases": biases}
            exact = mx.dequantize(
                wq, scales.astype(mx.float32), biases.astype(mx.float32), group_size, bits
            )
            decoded[name] = np.array(exact.astype(mx.float32))
        else:
            arrays[name] = value
            decoded[name] = np.array(value.astype(mx.float32))

    names = sorted(arrays)
    per_shard = -(-len(names) // shards)
    groups = [names[i : i + per_shard] for i in range(0, len(names), per_shard)]
    if len(groups) != shards:
        raise ValueError(f"cannot split {len(names)} tensors into {shards} shards")
    if shards == 1:
        mx.save_safetensors(str(directory / "model.safetensors"), arrays, {"format": "mlx"})
    else:
        weight_map = {}
        for i, group in enumerate(groups, start=1):
            file = f"model-{i:05d}-of-{shards:05d}.safetensors"
            mx.save_safetensors(
                str(directory / file), {n: arrays[n] for n in group}, {"format": "mlx"}
            )
            weight_map |= {n: file for n in group}
        total = sum(a.nbytes for a in arrays.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    write_hf_tokenizer(directory)
    return TinySpec(family, config, decoded)
