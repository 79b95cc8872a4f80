"""Convert a Llama-family GGUF into an MLX model directory that mlx-lm (and our loader) reads.

The 4-bit and 8-bit weights are kept exactly as they are: MLX's GGUF reader already turns
Q4_0 / Q4_1 / Q8_0 blocks into MLX's affine layout (packed uint32 weight, scales, biases,
group size 32), which is what mlx-lm's quantized layers hold. Two things change on the way:

- names: GGUF's `blk.N.attn_q` becomes Hugging Face's `model.layers.N.self_attn.q_proj`;
- Q/K rows: llama.cpp's converter interleaves each head's two rotate_half halves so its
  pairwise ("traditional") rope applies; mlx-lm's Llama uses rotate_half rope, so the rows
  are put back. Quantization groups run along a row, so moving whole rows of the packed
  weight, its scales and its biases is exact.

mlx-lm's "quantization" config is one (group_size, bits) for the model; tensors with other
bits (the default model's Q8_0 embedding beside Q4_1 layers) get its per-layer override form:
{"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}}.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from engine.errors import ModelLoadError, UnsupportedArchitecture
from engine.loader import read_gguf
from engine.models.base import ModelConfig
from engine.tokenizer import Tokenizer
from kernels.ops import QuantizedWeight

GGUF_GROUP_SIZE = 32  # Q4_0, Q4_1 and Q8_0 blocks all hold 32 weights


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Write config.json, model.safetensors, tokenizer.json and tokenizer_config.json."""
    gguf_path, out = Path(gguf_path).expanduser(), Path(out_dir).expanduser()
    if not gguf_path.is_file():
        raise ModelLoadError(gguf_path, "no such file")
    files = read_gguf(gguf_path)
    cfg, weights, tokenizer = files.config, files.weights, files.tokenizer
    if cfg.family != "llama":
        raise UnsupportedArchitecture(
            gguf_path, f"conversion supports Llama-family GGUF files, not {cfg.family!r}"
        )
    arrays: dict[str, mx.array] = {}
    bits_of: dict[str, int] = {}  # module path -> bits, for quantized tensors
    for name, value in weights.tensors.items():
        n_head = _rope_heads(name, cfg)
        if n_head:
            value = _unpermute_rows(value, n_head)
        if isinstance(value, QuantizedWeight):
            module = name.removesuffix(".weight")
            arrays[name] = value.packed
            arrays[f"{module}.scales"] = value.scales
            arrays[f"{module}.biases"] = value.biases
            bits_of[module] = value.bits
        else:
            arrays[name] = value
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), arrays, {"format": "mlx"})
    config = _hf_config(cfg, tokenizer, _quantization(bits_of))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    _write_tokenizer(out, tokenizer, cfg.context_length)
    return out


def _rope_heads(name: str, cfg: ModelConfig) -> int:
    """How many heads a Q or K projection's rows were permuted over; 0 for other tensors."""
    if name.endswith("self_attn.q_proj.weight"):
        return cfg.num_heads
    if name.endswith("self_attn.k_proj.weight"):
        return cfg.num_kv_heads
    return 0


def _unpermute_rows(value: Any, n_head: int) -> Any:
    """Invert convert_hf_to_gguf.py's LlamaModel.permute on the rows (output features)."""
    if isinstance(value, QuantizedWeight):
        return QuantizedWeight(
            _unpermute(value.packed, n_head),
            _unpermute(value.scales, n_head),
            _unpermute(value.biases, n_head),
            value.group_size,
            value.bits,
        )
    return _unpermute(value, n_head)


def _unpermute(w: mx.array, n_head: int) -> mx.array:
    rows, cols = int(w.shape[0]), int(w.shape[1])
    if rows % (2 * n_head):
        raise ValueError(f"{rows} rows do not split into {n_head} heads of rope pairs")
    half = rows // n_head // 2
    # [n_head, half, 2, cols] (pairs interleaved) -> [n_head, 2, half, cols] (two halves)
    return w.reshape(n_head, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _quantization(bits_of: dict[str, int]) -> dict[str, Any] | None:
    """mlx-lm's quantization dict: the commonest bits globally, overrides for the rest."""
    if not bits_of:
        return None
    common = Counter(bits_of.values()).most_common(1)[0][0]
    quant: dict[str, Any] = {"group_size": GGUF_GROUP_SIZE, "bits": common}
    for module, bits in sorted(bits_of.items()):
        if bits != common:
            quant[module] = {"group_size": GGUF_GROUP_SIZE, "bits": bits}
    return quant


def _hf_config(
    cfg: ModelConfig, tokenizer: Tokenizer, quantization: dict[str, Any] | None
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": _shortest(cfg.rms_norm_eps),
        "rope_theta": _shortest(cfg.rope_theta),
        "rope_scaling": None,
        "max_position_embeddings": cfg.context_length,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
    }
    if quantization is not None:
        config["quantization"] = quantization
    return config


def _shortest(value: float) -> float:
    """GGUF stores float32: 1e-5 reads back as 9.9999997e-06; write the float32's short form."""
    return float(str(np.float32(value)))


def _write_tokenizer(out: Path, tokenizer: Tokenizer, context_length: int) -> None:
    tokenizer.hf.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.bos_token or None,
        "eos_token": tokenizer.eos_token or None,
        "pad_token": tokenizer.eos_token or None,
        "add_bos_token": tokenizer.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
        "chat_template": tokenizer.chat_template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
