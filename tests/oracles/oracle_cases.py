"""The tiny oracle checkpoints: one config per family and rope / sliding-window variant.

Plain data, shared by the fixture script (which writes them with transformers) and the
tests (which read the manifest it writes). Checkpoints with GGUF versions have a hidden
size of 256, the row length every K-quant block needs; the variants that only exercise a
config switch stay narrow. Variants of a family share its weights (same shapes, same
seed), so each weight file is committed once.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.tiny_tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE

# Each quantized GGUF's reference is transformers run on its exact dequantized values, so
# Q8_0 checks a family's GGUF layout as strictly as F16 would; F16 files are written for
# llama only (and the narrow variants), to keep the fixtures small.
QUANT_TYPES = ("Q8_0", "Q6_K", "Q4_K_M")
SEQUENCE_LENGTHS = (32, 6)  # token id sequences per checkpoint; every position is checked
SEED = 1234


@dataclass(frozen=True)
class TinyCase:
    name: str
    config: dict  # config.json fields (transformers fills in the rest)
    weights_from: str = ""  # the case whose weights it shares ("": its own)
    gguf_types: tuple[str, ...] = ()  # GGUF files written by llama.cpp's converter + quantizer
    convert_flags: tuple[str, ...] = ()  # extra convert_hf_to_gguf.py flags
    notes: str = ""

    @property
    def weights_owner(self) -> str:
        return self.weights_from or self.name


def _wide(**fields: object) -> dict:
    """256 wide: q/k/v/gate/up rows hold one K-quant block; o/down (64 long) fall back."""
    base: dict = {
        "hidden_size": 256,
        "intermediate_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "num_hidden_layers": 1,
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }
    return {**base, **fields}


def _narrow(**fields: object) -> dict:
    return _wide(
        hidden_size=64,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=2,
        **fields,
    )


_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}


def _llama_rope(rope: dict) -> dict:
    rope_parameters = {"rope_theta": 10000.0, **rope}
    return _narrow(**_LLAMA, tie_word_embeddings=False, rope_parameters=rope_parameters)


def _gemma3(**fields: object) -> dict:
    return _wide(
        architectures=["Gemma3ForCausalLM"],
        model_type="gemma3_text",
        num_hidden_layers=6,
        intermediate_size=32,
        sliding_window=8,
        hidden_activation="gelu_pytorch_tanh",
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        **fields,
    )


CASES: tuple[TinyCase, ...] = (
    TinyCase(
        "llama",
        _wide(**_LLAMA, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        gguf_types=("F16", *QUANT_TYPES),
    ),
    TinyCase("llama_rope_default", _llama_rope({"rope_type": "default"}), gguf_types=("F16",)),
    TinyCase(
        "llama_rope_llama3",
        _llama_rope(
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
        weights_from="llama_rope_default",
        gguf_types=("F16",),
        notes="llama.cpp reads it as the rope_freqs tensor the converter writes",
    ),
    TinyCase(
        "llama_rope_linear",
        _llama_rope({"rope_type": "linear", "factor": 4.0}),
        weights_from="llama_rope_default",
        gguf_types=("F16",),
    ),
    TinyCase(
        "llama_rope_dynamic",
        _llama_rope({"rope_type": "dynamic", "factor": 4.0}) | {"max_position_embeddings": 16},
        weights_from="llama_rope_default",
        notes="HF rescales the base once the forward's positions pass max_position_embeddings "
        "(16): the reference is one forward of each whole sequence; llama.cpp has no dynamic",
    ),
    TinyCase(
        "llama_rope_yarn",
        _llama_rope(
            {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
            }
        ),
        weights_from="llama_rope_default",
        gguf_types=("F16",),
    ),
    TinyCase(
        "qwen2",
        _wide(
            architectures=["Qwen2ForCausalLM"],
            model_type="qwen2",
            num_attention_heads=8,
            num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
        gguf_types=QUANT_TYPES,
        notes="q/k/v biases; 8 heads of 32 (llama.cpp's qwen2 takes head_dim as hidden / heads)",
    ),
    TinyCase(
        "qwen3",
        _wide(**_QWEN3, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        gguf_types=QUANT_TYPES,
        notes="q/k norms",
    ),
    TinyCase(
        "qwen3_sliding",
        _narrow(**_QWEN3, use_sliding_window=True, sliding_window=8, max_window_layers=1),
        notes="layer 0 full attention, layer 1 a window of 8 (llama.cpp's qwen3 has no window)",
    ),
    TinyCase(
        "qwen3_window_off",
        _narrow(**_QWEN3, use_sliding_window=False, sliding_window=8, max_window_layers=1),
        weights_from="qwen3_sliding",
        notes="an integer sliding_window with use_sliding_window false: every layer full",
    ),
    TinyCase(
        "gemma3",
        _gemma3(query_pre_attn_scalar=64),
        notes="5 sliding layers (window 8) then 1 global; query_pre_attn_scalar 64 != head_dim",
    ),
    TinyCase(
        "gemma3_gguf",
        _gemma3(query_pre_attn_scalar=32),
        weights_from="gemma3",
        gguf_types=QUANT_TYPES,
        notes="gemma3's weights with query_pre_attn_scalar = head_dim: a GGUF has no key for "
        "it (llama.cpp scales by 1/sqrt(head_dim)) nor for the layer pattern (llama.cpp's "
        "fixed 5:1 for gemma3)",
    ),
    TinyCase(
        "qwen3_5",
        _wide(
            architectures=["Qwen3_5ForCausalLM"],
            model_type="qwen3_5_text",
            num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=1,
            linear_num_value_heads=2,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            linear_conv_kernel_dim=4,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        ),
        gguf_types=QUANT_TYPES,
        convert_flags=("--no-mtp",),  # the checkpoint has no MTP head
        notes="hybrid: one Gated DeltaNet layer, one gated attention",
    ),
)
