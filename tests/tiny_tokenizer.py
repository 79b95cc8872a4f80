"""The tiny models' shared tokenizer: a byte-level BPE like SmolLM2's, cut down to ~320
tokens, written the ways a real download holds it (GGUF metadata, tokenizer.json and
tokenizer_config.json), with SmolLM2-Instruct's chat template.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

# --- the shared tokenizer: byte-level BPE like SmolLM2's, cut down to ~320 tokens ---

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_ID, EOS_ID = 1, 2  # like SmolLM2's GGUF: a BOS id is recorded but never added
TOKEN_TYPE_NORMAL, TOKEN_TYPE_CONTROL = 1, 3

# SmolLM2-Instruct's ChatML template, verbatim from the default model's GGUF.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# In priority order; each merge joins two tokens that already exist.
# fmt: off
MERGES = [
    "Ġ t", "Ġ a", "i n", "h e", "Ġ Ġ", "r e", "o n", "e r", "Ġt he", "a t", "Ġ s", "Ġ o", "e n",
    "Ġ c", "e s", "Ġ w", "n d", "i t", "o r", "i s", "a l", "Ġ p", "in g", "Ġ f", "a n", "e d",
    "Ġ b", "o u", "a r", "Ġ in", "Ġ m", "Ġo f", "Ġ d", "Ġ h", "Ġa nd", "i c", "a s", "l e", "Ġt o",
    "i on", "o m", "l l", "en t", "Ġ n", "Ġ l", "s t", "Ġ re", "v e", "Ġ e", "r o", "l y", "Ġb e",
    "Ġ g", "Ġ T", "c t", "Ġ y", "Ġs t", "Ġ I", "Ġ is", "Ġh e", "l o",
]
# fmt: on


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, in GPT-2's order (printable bytes first)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + n)
    return table


def vocab_tokens() -> tuple[list[str], list[str]]:
    """(tokens by id, merges as "a b"), the vocab padded to a multiple of 32 with merges."""
    tokens = [*SPECIAL_TOKENS, *bytes_to_unicode().values()]
    merges = list(MERGES)
    pad = (f"Ġ {c}" for c in "uvkjqxzUVKJQXZ")
    while (len(tokens) + len(merges)) % 32:
        merges.append(next(pad))
    for merge in merges:
        left, right = merge.split(" ")
        if left not in tokens or right not in tokens:
            raise ValueError(f"merge {merge!r} joins a token not in the vocab")
        tokens.append(left + right)
    return tokens, merges


VOCAB_SIZE = len(vocab_tokens()[0])


def token_types() -> list[int]:
    return [TOKEN_TYPE_CONTROL] * len(SPECIAL_TOKENS) + [TOKEN_TYPE_NORMAL] * (
        VOCAB_SIZE - len(SPECIAL_TOKENS)
    )


def add_gguf_tokenizer(writer: gguf.GGUFWriter) -> None:
    tokens, merges = vocab_tokens()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types())
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(EOS_ID)
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def build_hf_tokenizer() -> Tokenizer:
    tokens, merges = vocab_tokens()
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ")) for m in merges]
    tok = Tokenizer(models.BPE(vocab, pairs, unk_token=None, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL_TOKENS])
    return tok


def write_hf_tokenizer(directory: Path) -> None:
    build_hf_tokenizer().save(str(directory / "tokenizer.json"))
    added = {
        str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, s in enumerate(SPECIAL_TOKENS)
    }  # fmt: skip
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 8192,
        "pad_token": "<|im_end|>",
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": "<|endoftext|>",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
