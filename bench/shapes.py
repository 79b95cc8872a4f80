"""`python -m bench shapes`: random-weight 4-bit GGUF checkpoints in the true shapes people run.

    python -m bench shapes list
    python -m bench shapes write --shape llama-3.1-8b --out DIR [--quant q4_k_m|q4_0] [--seed N]

A shape is a model's published hyper-parameters (its Hugging Face config.json) and the
vocabulary layout of its family; `bench/shapes_gguf.py` writes it as llama.cpp's
convert_hf_to_gguf.py + llama-quantize would (architecture, metadata keys, tensor names
and order, the Q4_K_M type mixture), with random quantized blocks instead of trained ones.
Nothing is drawn as floats and quantized, so an 8B file is written in seconds: decode and
prefill speed depend on the shapes and the tensor types, not on the values. The `tiny-*`
shapes are the same families at test size.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from bench.shapes_gguf import parameter_count, tensor_plan, write_gguf
from engine.config import EngineConfig

QUANTS = ("q4_k_m", "q4_0")


@dataclass(frozen=True)
class Vocabulary:
    """A family's token layout: `vocab_size - num_special` ordinary ids (the 256 bytes of
    GPT-2's byte-level alphabet first, as in the real vocabularies), then its special range:
    the named tokens, then unnamed ones (`unnamed` formatted with the id and its index in the
    range) up to vocab_size."""

    pre: str  # tokenizer.ggml.pre, as the converter names the family's pre-tokenizer
    num_special: int
    specials: tuple[str, ...]
    unnamed: str  # "<|reserved_special_token_{n}|>" (control) or "[PAD{id}]" (unused)
    bos: str
    eos: str
    pad: str | None
    add_bos: bool
    chat_template: str


@dataclass(frozen=True)
class Llama3Rope:
    """rope_scaling {"rope_type": "llama3", ...}: written as a rope_freqs tensor."""

    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192


@dataclass(frozen=True)
class GatedDeltaNet:
    """Qwen3.5's linear-attention layers (config.json's linear_* fields)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    full_attention_interval: int  # every n-th layer is gated full attention
    partial_rotary_factor: float  # of the attention layers' head_dim
    rope_sections: tuple[int, int, int, int]  # mrope sections (pairs); one position on text


@dataclass(frozen=True)
class Shape:
    name: str
    arch: str  # llama.cpp's architecture: llama, qwen3, qwen35
    title: str
    source: str  # where the numbers come from
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    rope_theta: float
    rms_norm_eps: float
    context_length: int
    vocab: Vocabulary
    llama3_rope: Llama3Rope | None = None
    linear: GatedDeltaNet | None = None
    published_params: float | None = None  # the model card's parameter count

    def __post_init__(self) -> None:
        if self.arch not in ("llama", "qwen3", "qwen35"):
            raise ValueError(f"{self.name}: architecture {self.arch!r} is not llama/qwen3/qwen35")
        if (self.arch == "qwen35") != (self.linear is not None):
            raise ValueError(f"{self.name}: Gated DeltaNet fields go with qwen35 only")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: {self.num_heads} heads over {self.num_kv_heads} kv")
        if self.vocab_size - self.vocab.num_special <= 256:
            raise ValueError(f"{self.name}: vocab {self.vocab_size} leaves no room past the bytes")
        if self.linear and self.linear.num_value_heads % self.linear.num_key_heads:
            raise ValueError(f"{self.name}: value heads must tile the key heads")
        if self.linear and 2 * sum(self.linear.rope_sections) != self.rotary_dim:
            raise ValueError(f"{self.name}: rope sections do not cover the rotary dims")

    @property
    def rotary_dim(self) -> int:
        if self.linear is None:
            return self.head_dim
        return int(self.head_dim * self.linear.partial_rotary_factor)

    def is_recurrent(self, layer: int) -> bool:
        """Whether `layer` is a Gated DeltaNet layer (False for every layer of llama/qwen3)."""
        if self.linear is None:
            return False
        return (layer + 1) % self.linear.full_attention_interval != 0


_LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] "
    "+ '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
_CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Llama 3.1 / 3.2's 256 special tokens from id 128000 (tokenizer.json), the Instruct EOS.
LLAMA3_VOCAB = Vocabulary(
    pre="llama-bpe",
    num_special=256,
    specials=(
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|reserved_special_token_2|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    ),
    unnamed="<|reserved_special_token_{n}|>",  # n from 3, as in the real list
    bos="<|begin_of_text|>",
    eos="<|eot_id|>",
    pad=None,
    add_bos=True,
    chat_template=_LLAMA3_TEMPLATE,
)
# Qwen3's 26 added tokens from id 151643, then the converter's [PAD{id}] up to vocab_size.
_QWEN_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
)  # fmt: skip
QWEN3_VOCAB = Vocabulary(
    pre="qwen2",
    num_special=151936 - 151643,
    specials=_QWEN_SPECIALS,
    unnamed="[PAD{id}]",
    bos="<|endoftext|>",
    eos="<|im_end|>",
    pad="<|endoftext|>",
    add_bos=False,
    chat_template=_CHATML_TEMPLATE,
)
# Qwen3.5: <|endoftext|> 248044 (the base model's EOS), <|im_end|> 248046 (the chat EOS); the
# names past those three follow Qwen3's list (the bench never reads them).
QWEN35_VOCAB = Vocabulary(
    pre="qwen35",
    num_special=248320 - 248044,
    specials=_QWEN_SPECIALS,
    unnamed="[PAD{id}]",
    bos="<|endoftext|>",
    eos="<|im_end|>",
    pad="<|endoftext|>",
    add_bos=False,
    chat_template=_CHATML_TEMPLATE,
)

_HF = "huggingface.co/{}/blob/main/config.json"
_TINY = "a test-size model of the family: rows of 256 so every K-quant block fits"
SHAPES = {
    shape.name: shape
    for shape in (
        Shape(
            "llama-3.2-1b", "llama", "Llama 3.2 1B", _HF.format("meta-llama/Llama-3.2-1B-Instruct"),
            hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64,
            intermediate_size=8192, vocab_size=128256, tie_embeddings=True,
            rope_theta=500000.0, rms_norm_eps=1e-5, context_length=131072, vocab=LLAMA3_VOCAB,
            llama3_rope=Llama3Rope(32.0), published_params=1.24e9,
        ),
        Shape(
            "llama-3.1-8b", "llama", "Llama 3.1 8B", _HF.format("meta-llama/Llama-3.1-8B-Instruct"),
            hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
            intermediate_size=14336, vocab_size=128256, tie_embeddings=False,
            rope_theta=500000.0, rms_norm_eps=1e-5, context_length=131072, vocab=LLAMA3_VOCAB,
            llama3_rope=Llama3Rope(8.0), published_params=8.03e9,
        ),
        Shape(
            "qwen3-4b", "qwen3", "Qwen3 4B", _HF.format("Qwen/Qwen3-4B"),
            hidden_size=2560, num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
            intermediate_size=9728, vocab_size=151936, tie_embeddings=True,
            rope_theta=1000000.0, rms_norm_eps=1e-6, context_length=40960, vocab=QWEN3_VOCAB,
            published_params=4.02e9,
        ),
        # text_config of the vision-language release; 0.8B counts its vision tower (~0.1B)
        Shape(
            "qwen3.5-0.8b", "qwen35", "Qwen3.5 0.8B", _HF.format("Qwen/Qwen3.5-0.8B"),
            hidden_size=1024, num_layers=24, num_heads=8, num_kv_heads=2, head_dim=256,
            intermediate_size=3584, vocab_size=248320, tie_embeddings=True,
            rope_theta=10000000.0, rms_norm_eps=1e-6, context_length=262144,
            vocab=QWEN35_VOCAB, published_params=0.8e9,
            linear=GatedDeltaNet(16, 16, 128, 128, conv_kernel=4, full_attention_interval=4,
                                 partial_rotary_factor=0.25, rope_sections=(11, 11, 10, 0)),
        ),
        Shape(
            "tiny-llama", "llama", "tiny Llama 3", _TINY, hidden_size=256, num_layers=4,
            num_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=512, vocab_size=1024,
            tie_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5, context_length=2048,
            vocab=LLAMA3_VOCAB, llama3_rope=Llama3Rope(8.0, original_context=256),
        ),
        Shape(
            "tiny-qwen3", "qwen3", "tiny Qwen3", _TINY, hidden_size=256, num_layers=4,
            num_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=512, vocab_size=1024,
            tie_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6, context_length=2048,
            vocab=QWEN3_VOCAB,
        ),
        Shape(
            "tiny-qwen3.5", "qwen35", "tiny Qwen3.5", _TINY, hidden_size=256, num_layers=4,
            num_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=512, vocab_size=1024,
            tie_embeddings=True, rope_theta=10000000.0, rms_norm_eps=1e-6, context_length=2048,
            vocab=QWEN35_VOCAB,
            # 2 key heads, 4 value heads: the converter's tiled value-head order is in play
            linear=GatedDeltaNet(2, 4, 64, 64, conv_kernel=4, full_attention_interval=4,
                                 partial_rotary_factor=0.25, rope_sections=(3, 3, 2, 0)),
        ),
    )
}  # fmt: skip


def file_name(shape: Shape, quant: str = "q4_k_m", output_type: str = "q6_k") -> str:
    """NAME.gguf for llama-quantize's defaults, else NAME-q4_0[-q8_0-output].gguf."""
    parts = [shape.name] + [quant] * (quant != "q4_k_m")
    parts += [f"{output_type}-output"] * (output_type != "q6_k")
    return "-".join(parts) + ".gguf"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench shapes", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="print the shapes")
    write = commands.add_parser("write", help="write one shape as DIR/NAME.gguf")
    write.add_argument("--shape", required=True, choices=sorted(SHAPES))
    write.add_argument("--out", required=True, type=Path, help="the directory to write into")
    write.add_argument("--quant", choices=QUANTS, default="q4_k_m")
    write.add_argument(
        "--output-type",
        choices=("q6_k", "q8_0"),
        default="q6_k",
        help="the output matrix's type (llama-quantize --output-tensor-type; default q6_k, as "
        "llama.cpp picks; mlx-lm's conversion holds Q6_K dense in float32)",
    )
    write.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def print_shapes() -> None:
    """One line a shape: its size, parameters, Q4_K_M tensor bytes and where it is from."""
    header = f"{'shape':<14}{'arch':<8}{'layers':>7}{'hidden':>7}{'heads':>7}{'vocab':>8}"
    print(f"{header}{'params':>8}{'Q4_K_M':>9}  source")
    for shape in SHAPES.values():
        heads = f"{shape.num_heads}/{shape.num_kv_heads}"
        params = parameter_count(shape) / 1e9
        gib = sum(t.nbytes for t in tensor_plan(shape)) / 2**30
        print(
            f"{shape.name:<14}{shape.arch:<8}{shape.num_layers:>7}{shape.hidden_size:>7}"
            f"{heads:>7}{shape.vocab_size:>8}{params:>7.3f}B{gib:>6.2f} GiB  {shape.source}"
        )


def main(argv: list[str], config: EngineConfig | None = None) -> int:
    """`config` is the bench's engine configuration; writing a file does not use it."""
    args = parse_args(argv)
    if args.command == "list":
        print_shapes()
        return 0
    shape = SHAPES[args.shape]
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    path = args.out / file_name(shape, args.quant, args.output_type)
    write_gguf(shape, path, args.quant, args.output_type.upper(), args.seed)
    seconds = time.perf_counter() - t0
    size = path.stat().st_size
    print(f"{path}  {size / 2**20:.1f} MiB ({size} bytes) in {seconds:.1f} s")
    return 0
