"""A shape (bench/shapes.py) as the GGUF file llama.cpp would have made of that model, with
random weights, written block by block.

What matches llama.cpp (convert_hf_to_gguf.py, then llama-quantize, as vendored by
llama-cpp-python 0.3.36):
- tensors: the converter's names and layouts, Qwen3.5's linear layers as attn_qkv | attn_gate
  | ssm_alpha | ssm_beta | ssm_a | ssm_conv1d (C, K) | ssm_dt.bias | ssm_norm | ssm_out, a
  Llama 3 rope scaling as a rope_freqs tensor; in llama-quantize's order (the global tensors,
  then by layer, by name within one: llama_model_loader's weight_name_comparer).
- types (src/llama-quant.cpp): norms and other 1-D tensors, and ssm_conv1d, stay F32; the
  output matrix (the embedding when it is tied) is Q6_K; for Q4_K_M, attn_v and attn_qkv
  (counted together, in order) and ffn_down take Q6_K where `use_more_bits` says, the rest
  Q4_K; a row that does not fill the type's block falls back (Q4_K -> Q5_0, Q6_K -> Q8_0).
Not written: Qwen3.5's MTP block (as `convert_hf_to_gguf.py --no-mtp`; no forward reads it).

Values: random quant bits under fixed sub-block scales, and a float16 block scale d drawn so
a matrix's weights have a std of about 1/sqrt(row length) (the embedding and output: 3/sqrt(D),
for logits of std ~3): each projection keeps its input's scale, so activations stay bounded
through the layers. Norms are 1, Gated DeltaNet decays in [0.05, 1]. The tokenizer is a
byte-level BPE of exactly vocab_size tokens: the 256 bytes, a few hundred letter-pair merges,
filler tokens, then the family's special tokens at their real ids. Random weights measure
speed only: their greedy continuations fall into loops (no figure of speculative acceptance),
and Gated DeltaNet layers amplify rounding (at Qwen3.5 0.8B's 24 layers, 8-bit activations
move logits ~15% from float32 in our int8 path, ~30% in llama.cpp's).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

if TYPE_CHECKING:
    from bench.shapes import Shape

FILE_TYPES = {"q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}
DEFAULT_TYPES = {"q4_k_m": "Q4_K", "q4_0": "Q4_0"}
FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}  # llama-quant.cpp's tensor_type_fallback
LOGIT_STD = 3.0
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5  # GGUF token types
LETTERS = "etaoinshrdlcumwfgypbvkjxqz"  # merge order: English letter frequency
TensorSpec = tuple[str, tuple[int, ...], str, float]  # (name, shape, fill, std), untyped yet


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order, [rows, cols]: ggml's ne reversed
    kind: str  # the GGML type's name
    fill: str  # "random" (a matrix: std), "ones", "normal" (std), "decay", "rope_freqs"
    std: float = 0.0

    @property
    def nbytes(self) -> int:
        elements, block_bytes = gguf.GGML_QUANT_SIZES[GGMLQuantizationType[self.kind]]
        return math.prod(self.shape) // elements * block_bytes


def _uniform_std(levels: int) -> float:
    """The std of a quant drawn uniformly from `levels` integers."""
    return math.sqrt((levels * levels - 1) / 12)


@dataclass(frozen=True)
class Blocks:
    """Where a type's float16 scale d sits in a block, and a weight's std in units of d."""

    d_offset: int
    spread: float
    fixed: tuple[tuple[int, bytes], ...] = ()  # fields every block holds the same
    dmin_offset: int | None = None  # Q4_K: dmin = 7.5 d centres its 0..15 quants
    signed: bool = True  # a random sign of d keeps the offset quants' mean at 0


BLOCKS = {
    "Q4_0": Blocks(0, _uniform_std(16)),  # d, 16 x 2 nibbles: w = d (q - 8)
    "Q5_0": Blocks(0, _uniform_std(32)),  # d, high bits, nibbles: w = d (q - 16)
    "Q8_0": Blocks(0, _uniform_std(256)),  # d, 32 int8: w = d q
    # d, dmin, eight 6-bit (scale, min) pairs in 12 bytes, all 16 (bytes 0-7: 16 | 1 << 6),
    # 256 nibbles: w = d * 16 * q - dmin * 16
    "Q4_K": Blocks(0, 16 * _uniform_std(16), ((4, bytes([80] * 8 + [0] * 4)),), 2, False),
    # 256 6-bit quants, sixteen int8 scales (all 8), d: w = d * 8 * (q - 32)
    "Q6_K": Blocks(208, 8 * _uniform_std(64), ((192, bytes([8] * 16)),)),
}


# -- the tensors ---------------------------------------------------------------------------


def _layer_tensors(shape: Shape, i: int) -> list[TensorSpec]:
    """Layer i's tensors, as the converter names them."""
    D, F, hd = shape.hidden_size, shape.intermediate_size, shape.head_dim
    H, KV = shape.num_heads, shape.num_kv_heads
    out: list[TensorSpec] = []

    def matrix(stem: str, rows: int, cols: int) -> None:
        out.append((f"blk.{i}.{stem}.weight", (rows, cols), "random", 1 / math.sqrt(cols)))

    def vector(stem: str, n: int, fill: str = "ones", std: float = 0.0) -> None:
        suffix = "" if stem in ("ssm_a", "ssm_dt.bias") else ".weight"
        out.append((f"blk.{i}.{stem}{suffix}", (n,), fill, std))

    vector("attn_norm", D)
    vector("post_attention_norm" if shape.arch == "qwen35" else "ffn_norm", D)
    linear = shape.linear
    if linear is not None and shape.is_recurrent(i):
        nk, nv = linear.num_key_heads, linear.num_value_heads
        dk, dv = linear.key_head_dim, linear.value_head_dim
        matrix("attn_qkv", 2 * nk * dk + nv * dv, D)
        matrix("attn_gate", nv * dv, D)
        matrix("ssm_alpha", nv, D)
        matrix("ssm_beta", nv, D)
        matrix("ssm_out", D, nv * dv)
        vector("ssm_a", nv, "decay")
        vector("ssm_dt.bias", nv, "normal", 0.5)
        vector("ssm_norm", dv)
        conv = (2 * nk * dk + nv * dv, linear.conv_kernel)  # (channels, taps), as squeezed
        out.append((f"blk.{i}.ssm_conv1d.weight", conv, "normal", 1 / math.sqrt(conv[1])))
    else:
        gate = 2 if linear is not None else 1  # Qwen3.5's attn_q holds [query | gate] per head
        matrix("attn_q", gate * H * hd, D)
        matrix("attn_k", KV * hd, D)
        matrix("attn_v", KV * hd, D)
        matrix("attn_output", D, H * hd)
        if shape.arch != "llama":
            vector("attn_q_norm", hd)
            vector("attn_k_norm", hd)
    matrix("ffn_gate", F, D)
    matrix("ffn_up", F, D)
    matrix("ffn_down", D, F)
    return out


def _sort_key(name: str) -> tuple[int, str]:
    """llama_model_loader's weight_name_comparer: layer number (-1 for global), then name."""
    return (int(name.split(".")[1]) if name.startswith("blk.") else -1, name)


def _use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp: the first and last eighth of the layers, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fallback(kind: str, name: str, cols: int) -> str:
    """A type whose block fits the row, as tensor_type_fallback picks it."""
    for candidate in (kind, FALLBACK.get(kind)):
        if candidate and cols % gguf.GGML_QUANT_SIZES[GGMLQuantizationType[candidate]][0] == 0:
            return candidate
    raise ValueError(f"{name}: rows of {cols} fit no block of {kind} or its fallback")


def tensor_plan(shape: Shape, quant: str = "q4_k_m", output_type: str = "Q6_K") -> list[Tensor]:
    """Every tensor of the file, in the file's order, with llama-quantize's type for it
    (`output_type`: the output matrix's, as llama-quantize --output-tensor-type sets it)."""
    if quant not in FILE_TYPES:
        raise ValueError(f"quant {quant!r} is not one of {', '.join(FILE_TYPES)}")
    if output_type not in BLOCKS:
        raise ValueError(f"output type {output_type!r} is not one of {', '.join(BLOCKS)}")
    D, V = shape.hidden_size, shape.vocab_size
    raw: list[TensorSpec] = [("token_embd.weight", (V, D), "random", LOGIT_STD / math.sqrt(D))]
    raw.append(("output_norm.weight", (D,), "ones", 0.0))
    if not shape.tie_embeddings:
        raw.append(("output.weight", (V, D), "random", LOGIT_STD / math.sqrt(D)))
    if shape.llama3_rope is not None:
        raw.append(("rope_freqs.weight", (shape.head_dim // 2,), "rope_freqs", 0.0))
    for i in range(shape.num_layers):
        raw += _layer_tensors(shape, i)
    raw.sort(key=lambda t: _sort_key(t[0]))

    default = DEFAULT_TYPES[quant]
    more_bits = quant == "q4_k_m"
    is_attn_v = [n.endswith(("attn_v.weight", "attn_qkv.weight")) for n, *_ in raw]
    num_attn_v, i_attn_v, i_ffn_down = sum(is_attn_v), 0, 0
    plan = []
    for (name, dims, fill, std), attn_v in zip(raw, is_attn_v, strict=True):
        if len(dims) < 2 or "ssm_conv1d" in name:
            plan.append(Tensor(name, dims, "F32", fill, std))
            continue
        kind = default
        if name == "output.weight" or (shape.tie_embeddings and name == "token_embd.weight"):
            kind = output_type
        elif attn_v:
            kind = "Q6_K" if more_bits and _use_more_bits(i_attn_v, num_attn_v) else default
            i_attn_v += 1
        elif "ffn_down" in name:
            kind = "Q6_K" if more_bits and _use_more_bits(i_ffn_down, shape.num_layers) else default
            i_ffn_down += 1
        plan.append(Tensor(name, dims, _fallback(kind, name, dims[-1]), fill, std))
    return plan


def parameter_count(shape: Shape) -> int:
    """The model's weights (rope_freqs is derived from the config, not a parameter)."""
    return sum(math.prod(t.shape) for t in tensor_plan(shape) if t.fill != "rope_freqs")


# -- the values ----------------------------------------------------------------------------


def random_blocks(
    kind: str, shape: tuple[int, ...], std: float, bits: np.random.BitGenerator
) -> np.ndarray:
    """uint8 [blocks, block bytes] of `kind` with random quants: raw generator words, then
    the fixed fields and a float16 d = std / spread * u, u uniform in [0.5, 1.5] from the
    random bits already in d's place (their top bit the sign, where the type has one)."""
    layout = BLOCKS[kind]
    elements, block_bytes = gguf.GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    num_blocks = math.prod(shape) // elements
    size = num_blocks * block_bytes
    words = bits.random_raw(-(-size // 8))  # whole 64-bit words: the fastest draw numpy has
    blocks = words.view(np.uint8)[:size].reshape(num_blocks, block_bytes)
    for offset, value in layout.fixed:
        blocks[:, offset : offset + len(value)] = np.frombuffer(value, np.uint8)
    at = layout.d_offset
    raw = np.ascontiguousarray(blocks[:, at : at + 2]).view(np.uint16)[:, 0]
    d = np.float32(std / layout.spread) * (0.5 + (raw & 0x7FFF).astype(np.float32) / 0x7FFF)
    if layout.signed:
        d = np.where(raw & 0x8000, -d, d)
    blocks[:, at : at + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    if layout.dmin_offset is not None:
        dmin = (np.float32(7.5) * d).astype(np.float16).view(np.uint8).reshape(-1, 2)
        blocks[:, layout.dmin_offset : layout.dmin_offset + 2] = dmin
    return blocks


def rope_freqs(shape: Shape) -> np.ndarray:
    """Llama 3's per-frequency rope divisors, as convert_hf_to_gguf.py computes them."""
    rope = shape.llama3_rope
    if rope is None:
        raise ValueError(f"{shape.name} has no llama3 rope scaling")
    dim = shape.head_dim
    freqs = 1.0 / shape.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * math.pi / freqs
    smooth = (rope.original_context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    factors = 1 / ((1 - smooth) / rope.factor + smooth)
    factors = np.where(wavelen < rope.original_context / rope.high_freq_factor, 1.0, factors)
    factors = np.where(wavelen > rope.original_context / rope.low_freq_factor, rope.factor, factors)
    return factors.astype(np.float32)


def tensor_data(
    tensor: Tensor, shape: Shape, bits: np.random.BitGenerator, rng: np.random.Generator
) -> np.ndarray:
    if tensor.kind != "F32":
        return random_blocks(tensor.kind, tensor.shape, tensor.std, bits)
    if tensor.fill == "ones":
        return np.ones(tensor.shape, np.float32)
    if tensor.fill == "normal":
        return (tensor.std * rng.standard_normal(tensor.shape)).astype(np.float32)
    if tensor.fill == "decay":  # ssm_a holds A = -exp(A_log)
        return -rng.uniform(0.05, 1.0, tensor.shape).astype(np.float32)
    if tensor.fill == "rope_freqs":
        return rope_freqs(shape)
    raise ValueError(f"{tensor.name}: no F32 fill {tensor.fill!r}")


# -- the metadata --------------------------------------------------------------------------


def bytes_to_unicode() -> list[str]:
    """GPT-2's printable character for each byte, in GPT-2's order (printable bytes first):
    the first 256 tokens of the Llama 3 and Qwen vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    others = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + n) for n in range(len(others))]


def vocabulary(shape: Shape) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, their GGUF token types, merges) of exactly shape.vocab_size tokens."""
    vocab = shape.vocab
    num_regular = shape.vocab_size - vocab.num_special
    pairs = [("Ġ", c) for c in LETTERS] + list(product(LETTERS, LETTERS))
    pairs = pairs[: num_regular - 256]
    tokens = bytes_to_unicode() + [a + b for a, b in pairs]
    tokens += [f"<filler_{i}>" for i in range(len(tokens), num_regular)]
    types = [TOKEN_NORMAL] * num_regular
    named = len(vocab.specials)
    for n in range(vocab.num_special):
        token_id = num_regular + n
        if n < named:
            tokens.append(vocab.specials[n])
            types.append(TOKEN_CONTROL)
        else:  # Llama 3's reserved tokens go on from <|reserved_special_token_3|>
            tokens.append(vocab.unnamed.format(id=token_id, n=n - named + 3))
            types.append(TOKEN_CONTROL if vocab.unnamed.startswith("<|") else TOKEN_UNUSED)
    return tokens, types, [f"{a} {b}" for a, b in pairs]


def add_metadata(writer: gguf.GGUFWriter, shape: Shape, quant: str) -> None:
    arch = shape.arch
    writer.add_type("model")
    writer.add_name(f"{shape.title} (random weights)")
    writer.add_block_count(shape.num_layers)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    if arch == "llama":
        writer.add_vocab_size(shape.vocab_size)
        writer.add_rope_dimension_count(shape.head_dim)
    linear = shape.linear
    if linear is not None:
        writer.add_rope_dimension_sections(list(linear.rope_sections))
        writer.add_ssm_conv_kernel(linear.conv_kernel)
        writer.add_ssm_state_size(linear.key_head_dim)
        writer.add_ssm_group_count(linear.num_key_heads)
        writer.add_ssm_time_step_rank(linear.num_value_heads)
        writer.add_ssm_inner_size(linear.value_head_dim * linear.num_value_heads)
        recurrent = [shape.is_recurrent(i) for i in range(shape.num_layers)]
        key = f"{arch}.attention.recurrent_layers"  # gguf-py 0.19 has no add_ for it
        writer.add_key_value(key, recurrent, GGUFValueType.ARRAY, sub_type=GGUFValueType.BOOL)
        writer.add_full_attention_interval(linear.full_attention_interval)
        writer.add_rope_dimension_count(shape.rotary_dim)
    tokens, types, merges = vocabulary(shape)
    ids = {token: i for i, token in enumerate(tokens)}
    vocab = shape.vocab
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(ids[vocab.bos])
    writer.add_eos_token_id(ids[vocab.eos])
    if vocab.pad is not None:
        writer.add_pad_token_id(ids[vocab.pad])
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(False)
    writer.add_chat_template(vocab.chat_template)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_file_type(FILE_TYPES[quant])


def write_gguf(
    shape: Shape, path: Path, quant: str = "q4_k_m", output_type: str = "Q6_K", seed: int = 0
) -> Path:
    """Write `shape` to `path` one tensor at a time (the largest tensor is the most memory
    held); under a temporary name first, so a file at `path` is always whole."""
    plan = tensor_plan(shape, quant, output_type)
    partial = path.with_name(f".{path.name}.partial")
    writer = gguf.GGUFWriter(partial, shape.arch)
    try:
        add_metadata(writer, shape, quant)
        for t in plan:
            raw_type = GGMLQuantizationType[t.kind]
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        block_seed, vector_seed = np.random.SeedSequence(seed).spawn(2)
        bits, rng = np.random.PCG64(block_seed), np.random.default_rng(vector_seed)
        for t in plan:
            writer.write_tensor_data(tensor_data(t, shape, bits, rng))
        writer.close()
        os.replace(partial, path)
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    return path
