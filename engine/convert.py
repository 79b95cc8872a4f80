"""Convert a Llama, Qwen3, Qwen3.5 or Gemma 3 GGUF into an MLX model directory that mlx-lm
(and our loader) reads (what differs by family: engine/convert_families.py).

The weights become what mlx-lm's layers hold, with the values the GGUF decodes to:

- tensors MLX computes exactly (groups of 32 at 4, 5 or 8 bits: Q4_0, Q4_1, Q5_0, Q5_1,
  Q8_0, Q4_K, Q5_K) stay packed, in the affine form engine/gguf_file.py reads them into
  (kernels/gguf_quants.py: w = s * q + b per group, exact);
- Q2_K, Q3_K and Q6_K (groups of 16, which MLX has no form for) and Q8_K (whose s * q MLX
  would round before adding b) are written dense, each weight s * q + b rounded once:
  float32, since a Q6_K weight d * sc * (q - 32) needs up to 24 significant bits (float16,
  as bfloat16, is lossy there; it is kept only where it holds every weight exactly);
- names: GGUF's `blk.N.attn_q` becomes Hugging Face's `model.layers.N.self_attn.q_proj`;
- Q/K rows: for Llama, llama.cpp's converter interleaves each head's two rotate_half halves
  so its pairwise ("traditional") rope applies; mlx-lm's Llama uses rotate_half rope, so the
  rows are put back (a family whose GGUF rope is rotate_half already, Qwen3's and Gemma 3's,
  keeps them). Quantization groups run along a row, so moving whole rows of the packed
  weight, its scales and its biases is exact.

mlx-lm's "quantization" config is one (group_size, bits) for the model; tensors with other
bits (the default model's Q8_0 embedding beside Q4_1 layers) get its per-layer override, and a
matrix written dense gets `false`, mlx-lm's "not quantized" (mlx_lm.utils.load_model's
class_predicate returns a layer's entry as it is): {"group_size": 32, "bits": 4,
"model.embed_tokens": {"group_size": 32, "bits": 8}, "lm_head": false}.

The rope scaling goes into config.json as Hugging Face spells it: GGUF's linear and yarn keys,
and a Llama 3.x file's `rope_freqs` table (not a weight to mlx-lm, which refuses it) as the
llama3 rope_scaling it was computed from. Either way the directory's frequencies, by
engine/models/rope.py, must be the GGUF's, or the conversion is refused.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx
import numpy as np

from engine.convert_families import HF_NORM_OFFSET, family_config, family_tensors
from engine.errors import ModelLoadError, UnsupportedArchitecture
from engine.loader import read_gguf
from engine.models import rope
from engine.models.base import ModelConfig
from engine.models.llama import ROPE_FREQS
from engine.tokenizer import Tokenizer
from kernels.quantized import QuantizedWeight, dequantize

CONVERTED_ARCHITECTURES = ("llama", "qwen3", "qwen35", "qwen3_5", "gemma3")  # GGUF and family
# llama.cpp's converter computes rope_freqs in float32: a table recomputed from the derived
# llama3 parameters agrees to a few float32 ulps; a wrong parameter is ~1e-3 off
ROPE_RTOL = 1e-5
Module = str  # a layer's path, "model.layers.0.mlp.down_proj"
Held = tuple[int, int] | None  # (group_size, bits) of a packed matrix; None: written dense


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Write config.json, model.safetensors, tokenizer.json and tokenizer_config.json."""
    gguf_path, out = Path(gguf_path).expanduser(), Path(out_dir).expanduser()
    if not gguf_path.is_file():
        raise ModelLoadError(gguf_path, "no such file")
    header = _header(gguf_path)  # refuse an architecture before reading gigabytes of weights
    _refuse_architecture(gguf_path, str(header.get("general.architecture", "llama")))
    files = read_gguf(gguf_path)
    cfg, tokenizer = files.config, files.tokenizer
    _refuse_architecture(gguf_path, cfg.family)  # a header gguf-py could not read
    if cfg.rope_dims != cfg.head_dim and cfg.family != "qwen3_5":  # its partial rotary
        raise ModelLoadError(
            gguf_path, f"rope over {cfg.rope_dims} of {cfg.head_dim} head dims has no HF Llama form"
        )
    extra, refusal = family_config(cfg)
    if refusal:
        raise ModelLoadError(gguf_path, refusal)
    tensors = family_tensors(cfg, dict(files.weights.tensors))
    table = tensors.pop(ROPE_FREQS, None)
    rope_scaling = _rope_scaling(gguf_path, cfg, table, header)
    arrays, held = _mlx_tensors(tensors, cfg)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), arrays, {"format": "mlx"})
    config = _hf_config(cfg, tokenizer, rope_scaling, _quantization(held)) | extra
    (out / "config.json").write_text(json.dumps(config, indent=2))
    _write_tokenizer(out, tokenizer, cfg.context_length)
    return out


def check_convertible(gguf_path: str | Path) -> None:
    """Raise UnsupportedArchitecture where the GGUF's header names an architecture the
    converter does not take (a Qwen3.5 file): the header only, cheap on a file of gigabytes."""
    path = Path(gguf_path).expanduser()
    _refuse_architecture(path, str(_header(path).get("general.architecture", "llama")))


def _refuse_architecture(path: Path, arch: str) -> None:
    if arch not in CONVERTED_ARCHITECTURES:
        raise UnsupportedArchitecture(
            path,
            "conversion to an MLX directory takes Llama, Qwen3, Qwen3.5 and Gemma 3 GGUF files, "
            f"not {arch!r}",
        )


def _header(path: Path) -> dict[str, Any]:
    """The architecture and rope keys of the GGUF's header, read without its tensors; {}
    where gguf-py cannot parse it (read_gguf then names the problem)."""
    try:
        reader = gguf.GGUFReader(path)
    except Exception:  # a corrupt or truncated file: read_gguf's message says which
        return {}
    return {
        key: field.contents()
        for key, field in reader.fields.items()
        if key == "general.architecture" or ".rope." in key
    }


# -- weights --------------------------------------------------------------------------------


def _mlx_tensors(
    tensors: dict[str, Any], cfg: ModelConfig
) -> tuple[dict[str, mx.array], dict[Module, Held]]:
    """The safetensors arrays, and how each matrix is held (packed or dense)."""
    arrays: dict[str, mx.array] = {}
    held: dict[Module, Held] = {}
    shift = HF_NORM_OFFSET.get(cfg.family, 0.0) - cfg.norm_offset
    for name, value in tensors.items():
        n_head = _rope_heads(name, cfg) if cfg.rope_traditional else 0
        if n_head:
            value = _unpermute_rows(value, n_head)
        if shift and name.endswith("norm.weight"):  # as the HF form stores it
            value = mx.array(value).astype(mx.float32) - shift
        module = name.removesuffix(".weight")
        if isinstance(value, QuantizedWeight) and value.is_mlx_exact:
            arrays[name] = value.packed
            arrays[f"{module}.scales"] = value.scales
            arrays[f"{module}.biases"] = value.biases
            held[module] = (value.group_size, value.bits)
            continue
        if isinstance(value, QuantizedWeight):
            value = _dense(value)
        arrays[name] = value
        if value.ndim == 2:
            held[module] = None
    return arrays, held


def _dense(w: QuantizedWeight) -> mx.array:
    """Every weight s * q + b rounded once to float32 (gguf-py's value); float16 where that
    holds each exactly (a Q6_K tensor's d * sc * (q - 32) seldom fits 11 bits)."""
    dense = dequantize(w)
    half = dense.astype(np.float16)
    return mx.array(half if np.array_equal(half, dense) else dense)


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
            source=value.source,
            fma_only=value.fma_only,
        )
    return _unpermute(value, n_head)


def _unpermute(w: mx.array, n_head: int) -> mx.array:
    rows, cols = int(w.shape[0]), int(w.shape[1])
    if rows % (2 * n_head):
        raise ValueError(f"{rows} rows do not split into {n_head} heads of rope pairs")
    half = rows // n_head // 2
    # [n_head, half, 2, cols] (pairs interleaved) -> [n_head, 2, half, cols] (two halves)
    return w.reshape(n_head, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _quantization(held: dict[Module, Held]) -> dict[str, Any] | None:
    """mlx-lm's quantization dict: the commonest (group_size, bits) for the model, an entry
    for each packed matrix held otherwise, and `false` for each matrix written dense."""
    packed = [kind for kind in held.values() if kind is not None]
    if not packed:
        return None
    group_size, bits = Counter(packed).most_common(1)[0][0]
    quant: dict[str, Any] = {"group_size": group_size, "bits": bits}
    for module, kind in sorted(held.items()):
        if kind is None:
            quant[module] = False
        elif kind != (group_size, bits):
            quant[module] = {"group_size": kind[0], "bits": kind[1]}
    return quant


# -- rope -----------------------------------------------------------------------------------


def _rope_scaling(
    path: Path, cfg: ModelConfig, table: Any, header: dict[str, Any]
) -> dict[str, Any] | None:
    """config.json's rope_scaling, checked to give the GGUF's frequencies."""
    scaling = cfg.rope_scaling
    factors = None if table is None else np.array(table, dtype=np.float64).reshape(-1)
    if factors is not None and scaling is not None:
        raise ModelLoadError(
            path, f"rope_freqs beside a {scaling.rope_type} rope scaling has no HF Llama form"
        )
    if factors is not None:
        return _llama3_rope(path, cfg, factors, header)
    if scaling is None:
        return None
    if scaling.rope_type == "linear":
        hf: dict[str, Any] = {"rope_type": "linear", "factor": scaling.factor}
    elif scaling.rope_type == "yarn" and scaling.original_max_positions:
        hf = {
            "rope_type": "yarn",
            "factor": scaling.factor,
            "original_max_position_embeddings": scaling.original_max_positions,
            "beta_fast": scaling.beta_fast,
            "beta_slow": scaling.beta_slow,
        }
    else:
        raise ModelLoadError(path, f"GGUF rope scaling {scaling} is not converted")
    if not _same_rope(cfg, None, hf):
        raise ModelLoadError(path, f"rope_scaling {hf} does not give this file's frequencies")
    return hf


def _llama3_rope(
    path: Path, cfg: ModelConfig, table: np.ndarray, header: dict[str, Any]
) -> dict[str, Any] | None:
    """The llama3 rope_scaling llama.cpp's converter computed the rope_freqs table from
    (convert_hf_to_gguf.py's LlamaModel; transformers' _compute_llama3_parameters).

    The table is 1 at wavelengths W below W_high = L / high_freq_factor, `factor` above
    W_low = L / low_freq_factor, and between them 1 / ((1 - s) / factor + s) with
    s = (L / W - low_freq_factor) / (high_freq_factor - low_freq_factor): linear in 1 / W,
    0 at W_low and 1 at W_high. So the largest entry is the factor, and two entries between
    the edges fix both edges. L itself is not in the table (only L / low and L / high are):
    it is the header's rope.scaling.original_context_length where there is one, else W_low
    (low_freq_factor 1, as every Llama 3.x config has it)."""
    dims = cfg.rope_dims
    if table.shape != (dims // 2,) or table.min() < 1.0:
        raise ModelLoadError(path, f"rope_freqs of shape {table.shape} is not a llama3 table")
    factor = float(table.max())
    if factor == 1.0:
        return None  # every frequency as it is: plain rope
    wavelength = 2 * math.pi / rope.frequencies(dims, cfg.rope_theta, None)[0]
    between = (table > 1.0 + ROPE_RTOL) & (table < factor * (1.0 - ROPE_RTOL))
    if between.sum() < 2:
        raise ModelLoadError(
            path,
            f"rope_freqs has {between.sum()} entries between 1 and {factor:g}: a llama3 rope "
            "scaling cannot be derived from fewer than 2",
        )
    smooth = (1.0 / table[between] - 1.0 / factor) / (1.0 - 1.0 / factor)
    slope, intercept = np.polyfit(1.0 / wavelength[between], smooth, 1)
    w_low, w_high = -slope / intercept, slope / (1.0 - intercept)
    arch = str(header.get("general.architecture", "llama"))
    original = int(header.get(f"{arch}.rope.scaling.original_context_length") or round(w_low))
    exact = {"factor": factor, "low_freq_factor": original / w_low}
    exact["high_freq_factor"] = original / w_high
    short = {key: float(f"{value:.4g}") for key, value in exact.items()}  # 1.0, not 0.999999
    for params in (short, exact):
        hf = {"rope_type": "llama3", **params, "original_max_position_embeddings": original}
        if _same_rope(cfg, table, hf):
            return hf
    raise ModelLoadError(path, f"rope_freqs is not the table of a llama3 rope scaling ({exact})")


def _same_rope(cfg: ModelConfig, table: np.ndarray | None, hf: dict[str, Any]) -> bool:
    """Whether config.json's rope_scaling `hf` gives the GGUF's frequencies and attention
    factor (its scaling keys, then rope_freqs dividing the frequencies, as llama.cpp does)."""
    dims, theta = cfg.rope_dims, cfg.rope_theta
    want, want_factor = rope.frequencies(dims, theta, cfg.rope_scaling)
    if table is not None:
        want = want / table
    parsed = rope.parse_hf({"max_position_embeddings": cfg.context_length}, hf)
    got, got_factor = rope.frequencies(dims, theta, parsed)
    return bool(np.allclose(got, want, rtol=ROPE_RTOL, atol=0.0)) and math.isclose(
        got_factor, want_factor, rel_tol=ROPE_RTOL
    )


# -- config and tokenizer -------------------------------------------------------------------


def _hf_config(
    cfg: ModelConfig,
    tokenizer: Tokenizer,
    rope_scaling: dict[str, Any] | None,
    quantization: dict[str, Any] | None,
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
        "rope_scaling": rope_scaling,
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
