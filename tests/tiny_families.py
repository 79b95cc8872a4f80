"""Tiny random-weight models of the families beyond Llama / Qwen3 (Qwen2's q/k/v biases,
Gemma 3) and of rope variants, as Hugging Face directories and as GGUF files in
llama.cpp's converter layout (convert_hf_to_gguf.py: Gemma's norms stored as 1 + w, rope
pairs permuted for llama only, Llama 3's scaling as a rope_freqs tensor). Each returns a
`TinySpec` that tests/tiny_reference.py runs.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType

from tests.tiny_models import (
    FILE_TYPES,
    TinySpec,
    permute_for_rope,
    random_weights,
    tiny_config,
    unpermute_for_rope,
    write_hf_dir,
)
from tests.tiny_reference import inv_frequencies
from tests.tiny_tokenizer import add_gguf_tokenizer

GEMMA_WINDOW = 6  # tokens: prompts of a few dozen tokens go well past it
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def family_config(family: str, tie: bool, **overrides: object) -> dict:
    """config.json of a tiny `family`: llama, mistral, qwen2, qwen3 or gemma3."""
    if family in ("llama", "qwen3"):
        return tiny_config(family, tie, **overrides)
    if family == "mistral":
        config = tiny_config("llama", tie)
        config |= {"model_type": "mistral", "architectures": ["MistralForCausalLM"]}
    elif family == "qwen2":
        config = tiny_config("qwen3", tie, head_dim=16)
        config |= {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
    elif family == "gemma3":
        config = tiny_config("llama", tie, head_dim=32, rms_norm_eps=1e-6)
        for key in ("mlp_bias", "pretraining_tp", "hidden_act"):
            config.pop(key)
        config |= {
            "model_type": "gemma3_text",
            "architectures": ["Gemma3ForCausalLM"],
            "num_hidden_layers": 6,  # the default pattern: layer 5 is the global one
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": 24,  # not head_dim, to catch a scale from head_dim
            "rope_theta": 1_000_000.0,
            "rope_local_base_freq": 10_000.0,
            "sliding_window": GEMMA_WINDOW,
            "sliding_window_pattern": 6,
            "final_logit_softcapping": None,
            "attn_logit_softcapping": None,
        }
    else:
        raise ValueError(f"unknown tiny family {family!r}")
    config.update(overrides)
    return config


def family_weights(family: str, config: dict, seed: int) -> dict[str, np.ndarray]:
    base = "qwen3" if family in ("qwen3", "gemma3") else "llama"  # gemma3: q/k norms too
    w = random_weights(base, config, seed)
    rng = np.random.default_rng(seed + 1000)
    H, KV, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    D = config["hidden_size"]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if family == "qwen2":
            for name, rows in (("q_proj", H * hd), ("k_proj", KV * hd), ("v_proj", KV * hd)):
                w[f"{p}self_attn.{name}.bias"] = (0.5 * rng.standard_normal(rows)).astype(
                    np.float32
                )
        if family == "gemma3":
            w[p + "pre_feedforward_layernorm.weight"] = np.ones(D, np.float32)
            w[p + "post_feedforward_layernorm.weight"] = np.ones(D, np.float32)
    if family == "gemma3":  # zero-centred (HF): the norm multiplies by 1 + w
        for name in [n for n in w if "norm" in n]:
            w[name] = (0.1 * rng.standard_normal(w[name].shape)).astype(np.float32)
    return w


def make_family_hf(
    path: str | Path, family: str, *, tie: bool = False, seed: int = 0, **overrides: object
) -> TinySpec:
    config = family_config(family, tie, **overrides)
    return write_hf_dir(path, family, config, family_weights(family, config, seed))


_GGUF_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GGUF_NORMS = {
    "llama": {"post_attention_layernorm": "ffn_norm"},
    "gemma3": {
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    },
}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_tensor_name(family: str, hf_name: str) -> str:
    stem, _, suffix = hf_name.rpartition(".")
    if stem in _GLOBAL:
        return f"{_GLOBAL[stem]}.{suffix}"
    _, _, layer, rest = stem.split(".", 3)
    names = {**_GGUF_LAYER, **_GGUF_NORMS["gemma3" if family == "gemma3" else "llama"]}
    return f"blk.{layer}.{names[rest]}.{suffix}"


def _write_metadata(writer: gguf.GGUFWriter, family: str, config: dict, qtype: str) -> None:
    writer.add_name(f"Tiny {family}")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_file_type(FILE_TYPES[qtype])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_rope_dimension_count(config["head_dim"])
    if family == "gemma3":
        writer.add_sliding_window(config["sliding_window"])
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type") in ("linear", "yarn"):
        kind = (
            gguf.RopeScalingType.LINEAR
            if scaling["rope_type"] == "linear"
            else gguf.RopeScalingType.YARN
        )
        writer.add_rope_scaling_type(kind)
        writer.add_rope_scaling_factor(scaling["factor"])
        if "original_max_position_embeddings" in scaling:
            writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_gguf_tokenizer(writer)


def make_family_gguf(
    path: str | Path,
    family: str,
    *,
    qtype: str = "F32",
    tie: bool = True,
    seed: int = 0,
    extra: dict[str, np.ndarray] | None = None,
    **overrides: object,
) -> TinySpec:
    """A tiny GGUF of `family` (llama, qwen2, qwen3, gemma3); `extra` adds raw F32 tensors.
    A llama3 rope scaling is written as llama.cpp's converter does: a rope_freqs tensor."""
    if family == "gemma3":  # llama.cpp's gemma3: scale from key_length, local base 10000
        overrides = {"query_pre_attn_scalar": 32, **overrides}
    config = family_config(family, tie, **overrides)
    weights = family_weights(family, config, seed)
    H, KV = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(path), family)
    _write_metadata(writer, family, config, qtype)
    decoded: dict[str, np.ndarray] = {}
    for hf_name, w in weights.items():
        n_head = 0
        if family == "llama" and hf_name.endswith("proj.weight"):
            n_head = H if "q_proj" in hf_name else KV if "k_proj" in hf_name else 0
        stored = permute_for_rope(w, n_head) if n_head else w
        if family == "gemma3" and "norm" in hf_name:
            stored = (stored + 1.0).astype(np.float32)  # the converter's norm shift
        kind = qtype if w.ndim == 2 else "F32"
        raw_type = GGMLQuantizationType[kind]
        packed = gguf.quants.quantize(stored, raw_type)
        value = gguf.quants.dequantize(packed, raw_type).reshape(w.shape).astype(np.float32)
        value = unpermute_for_rope(value, n_head) if n_head else value
        decoded[hf_name] = value - 1.0 if family == "gemma3" and "norm" in hf_name else value
        name = gguf_tensor_name(family, hf_name)
        if kind in ("F32", "F16"):
            writer.add_tensor(name, packed)
        else:
            writer.add_tensor(name, packed, raw_dtype=raw_type)
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3":
        dim = config["head_dim"]
        plain, _ = inv_frequencies(config, {}, dim)
        scaled, _ = inv_frequencies(config, scaling, dim)
        writer.add_tensor("rope_freqs.weight", (plain / scaled).astype(np.float32))
    for name, tensor in (extra or {}).items():
        writer.add_tensor(name, tensor.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return TinySpec(family, config, decoded)
