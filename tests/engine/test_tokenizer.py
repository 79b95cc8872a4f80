"""Tokenizer: exact ids for the default model, loaders, and the streaming detokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
import tokenizers
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers

from engine.default_model import default_model_path
from engine.errors import EngineError, ModelLoadError
from engine.tokenizer import StreamingDetokenizer, Tokenizer

BYTE_ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())


def gpt2_byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character table (Radford et al. 2019, encoder.py)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


BYTE_CHAR = gpt2_byte_chars()
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Text that splits characters across byte tokens: emoji (with modifiers and ZWJ), CJK,
# combining marks, right-to-left scripts, CRLF.
STREAM_SAMPLES = [
    "Hello, world!",
    "I ❤️ 🦙 and 👍🏽",
    "👨‍👩‍👧‍👦 family",
    "日本語のテキストと中文",
    "e\u0301 n\u0303 a\u0308\u0304",
    "नमस्ते दुनिया",
    "مرحبا بالعالم",
    "line one\r\nline two\n\n\ttab",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑ x² ≤ ∞",
]


@pytest.fixture(scope="session")
def gguf_metadata() -> dict[str, Any]:
    path = default_model_path()
    if not path.is_file():
        pytest.skip(f"default model not present at {path}")
    return mx.load(str(path), return_metadata=True)[1]


@pytest.fixture(scope="session")
def smollm(gguf_metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(gguf_metadata, default_model_path())


def tiny_gguf_metadata(pre: str, **overrides: Any) -> dict[str, Any]:
    """GGUF-style metadata for a byte-level BPE with a few merges, values typed as mx.load's."""
    merges = ["1 2", "3 4", "12 3", "4 5", "h e", "l l", "he ll", "hell o"]
    tokens = [*SPECIALS, "<tool>", *BYTE_ALPHABET, "12", "34", "123", "45"]
    tokens += ["he", "ll", "hell", "hello", "abc"]  # "abc" has no merge path to it
    types = [3, 3, 3, 4] + [1] * (len(tokens) - 4)
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=mx.uint32),
    }
    meta.update(overrides)
    return meta


def pieces(tok: Tokenizer, text: str) -> list[str | None]:
    return [tok.id_to_token(i) for i in tok.encode(text)]


def stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    """Deltas from add() for each id, then flush()'s as the last element."""
    detok = StreamingDetokenizer(tok)
    return [detok.add(i) for i in ids] + [detok.flush()]


def assert_streams_like_decode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    deltas = stream(tok, ids)
    for i in range(len(ids)):
        # What is shown after id i is the full decode up to i, less an unfinished character.
        assert "".join(deltas[: i + 1]) == tok.decode(ids[: i + 1]).rstrip("\ufffd")
        assert "\ufffd" not in deltas[i]
    assert "".join(deltas) == tok.decode(ids) == text


# --- the default model (SmolLM2-135M-Instruct) ---

# (text, ids, vocabulary entries): the entries cross-check the ids against the vocab, in
# byte-level form (Ġ = space, Ċ = \n, č = \r; multi-byte characters show as their bytes).
KNOWN_IDS = [
    ("Hello world", [19556, 905], ["Hello", "Ġworld"]),
    ("Hello, world!", [19556, 28, 905, 17], ["Hello", ",", "Ġworld", "!"]),
    ("2024", [34, 32, 34, 36], ["2", "0", "2", "4"]),
    ("a\r\nb", [81, 201, 198, 82], ["a", "č", "Ċ", "b"]),
    ("don't", [12420, 982], ["don", "'t"]),
    (" 🦙 café", [15107, 116, 243, 37366], ["ĠðŁ", "¦", "Ļ", "ĠcafÃ©"]),
    (
        "<|im_start|>user\nHi<|im_end|>\n",
        [1, 4093, 198, 26843, 2, 198],
        ["<|im_start|>", "user", "Ċ", "Hi", "<|im_end|>", "Ċ"],
    ),
]


@pytest.mark.real_model
@pytest.mark.parametrize(("text", "ids", "entries"), KNOWN_IDS)
def test_default_model_known_ids(smollm: Tokenizer, text: str, ids: list[int], entries: list[str]):
    assert smollm.encode(text) == ids
    assert [smollm.token_to_id(e) for e in entries] == ids
    assert smollm.decode(ids) == text


@pytest.mark.real_model
def test_default_model_special_tokens(smollm: Tokenizer):
    assert smollm.vocab_size == 49152
    assert (smollm.bos_token, smollm.eos_token) == ("<|im_start|>", "<|im_end|>")
    # EOS is <|im_end|>; <|endoftext|> also ends generation, as in llama.cpp.
    assert smollm.eos_ids == frozenset({0, 2})
    assert smollm.add_bos is False
    assert smollm.encode("Hi", add_special=True) == smollm.encode("Hi") == [26843]
    assert [smollm.is_special(i) for i in (0, 1, 2, 16, 17, 19556)] == [True] * 4 + [False] * 2
    assert smollm.chat_template is not None and "<|im_start|>" in smollm.chat_template
    assert smollm.decode([1, 26843, 2], skip_special=True) == "Hi"


@pytest.mark.real_model
def test_default_model_drops_bytes_missing_from_its_vocab(smollm: Tokenizer):
    # SmolLM2's vocab has no token for a few control bytes (e.g. 0x1D); like llama.cpp,
    # they are dropped rather than mapped to <|endoftext|>.
    assert smollm.token_to_id(BYTE_CHAR[0x1D]) is None
    assert smollm.encode("a\x1db") == smollm.encode("a") + smollm.encode("b") == [81, 82]


@pytest.mark.real_model
@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=60))
def test_default_model_round_trip(smollm: Tokenizer, text: str):
    assume(all(smollm.token_to_id(BYTE_CHAR[b]) is not None for b in text.encode()))
    assume(not any(t in text for t in ("<|", "<repo", "<file", "<gh_", "<issue", "<jupyter")))
    assume("<empty_output>" not in text)
    assert smollm.decode(smollm.encode(text)) == text


@pytest.mark.real_model
@pytest.mark.parametrize("text", STREAM_SAMPLES)
def test_default_model_streams_like_decode(smollm: Tokenizer, text: str):
    assert_streams_like_decode(smollm, text)


# --- GGUF metadata without the real model ---


def test_gguf_metadata_builds_bpe_with_specials():
    tok = Tokenizer.from_gguf_metadata(tiny_gguf_metadata("default"), "tiny.gguf")
    assert pieces(tok, "<|im_start|>hello<tool><|im_end|>") == [
        "<|im_start|>",
        "hello",
        "<tool>",
        "<|im_end|>",
    ]
    assert (tok.bos_id, tok.eos_ids, tok.add_bos) == (1, frozenset({0, 2}), False)
    # User-defined tokens are matched in text but are text, not control tokens.
    assert tok.is_special(2) and not tok.is_special(3)
    assert tok.decode(tok.encode("<tool>hello"), skip_special=True) == "<tool>hello"


@pytest.mark.parametrize(
    ("pre", "expected"),
    [
        ("default", ["12", "34", "5", "a", "b", "c"]),  # gpt2: " ?\p{N}+" keeps 12345 whole
        ("smollm", ["1", "2", "3", "4", "5", "a", "b", "c"]),  # every digit alone
        ("qwen2", ["1", "2", "3", "4", "5", "a", "b", "c"]),
        ("llama-bpe", ["123", "45", "abc"]),  # digits in threes; whole-word vocab hits win
    ],
)
def test_gguf_pre_tokenizer_follows_llama_cpp(pre: str, expected: list[str]):
    tok = Tokenizer.from_gguf_metadata(tiny_gguf_metadata(pre), "tiny.gguf")
    assert pieces(tok, "12345abc") == expected


def test_gguf_llama3_adds_bos_unless_the_file_says_not():
    llama3 = Tokenizer.from_gguf_metadata(tiny_gguf_metadata("llama-bpe"), "tiny.gguf")
    assert llama3.add_bos and llama3.encode("hello", add_special=True)[0] == 1
    told = tiny_gguf_metadata("llama-bpe", **{"tokenizer.ggml.add_bos_token": mx.array(False)})
    assert not Tokenizer.from_gguf_metadata(told, "tiny.gguf").add_bos


def test_gguf_sentencepiece_model_without_scores_is_refused():
    # SentencePiece is served (tests/engine/test_tokenizer_spm.py), but not without scores
    meta = tiny_gguf_metadata("default", **{"tokenizer.ggml.model": "llama"})
    with pytest.raises(ModelLoadError, match="lacks tokenizer.ggml.scores") as info:
        Tokenizer.from_gguf_metadata(meta, "spm.gguf")
    assert info.value.path == "spm.gguf"


def test_gguf_missing_merges_is_refused():
    meta = tiny_gguf_metadata("default")
    del meta["tokenizer.ggml.merges"]
    with pytest.raises(ModelLoadError, match=r"tokenizer\.ggml\.merges"):
        Tokenizer.from_gguf_metadata(meta, "broken.gguf")


# --- a Hugging Face tokenizer.json directory ---

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def write_tiny_hf_dir(directory: Path) -> tokenizers.Tokenizer:
    """Train a ~300-token byte-level BPE and write it as a model directory would hold it."""
    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=BYTE_ALPHABET
    )
    hf.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    hf.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    hf.save(str(directory / "tokenizer.json"))
    config = {"bos_token": None, "eos_token": {"content": "<|im_end|>"}, "chat_template": CHATML}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return hf


def test_from_dir_reads_tokenizer_and_configs(tmp_path: Path):
    hf = write_tiny_hf_dir(tmp_path)
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.vocab_size == hf.get_vocab_size() > len(SPECIALS) + 256
    assert (tok.bos_id, tok.add_bos, tok.chat_template) == (None, False, CHATML)
    assert tok.eos_ids == frozenset({0, 2})
    text = "<|im_start|>the lazy fox<tool_call>🦊<|im_end|>"
    ids = tok.encode(text)
    assert ids[0] == 1 and ids[-1] == 2 and hf.token_to_id("<tool_call>") in ids
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special=True) == "the lazy fox<tool_call>🦊"
    assert_streams_like_decode(tok, "the lazy 🦊 jumps ünder")


def test_from_dir_prefers_chat_template_jinja(tmp_path: Path):
    write_tiny_hf_dir(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0].content }}")
    assert Tokenizer.from_dir(tmp_path).chat_template == "{{ messages[0].content }}"


def test_from_dir_without_tokenizer_json_takes_ids_only(tmp_path: Path):
    # the model still scores token ids (tests/engine/test_tokenizer_load_checks.py)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.eos_ids == frozenset({7}) and tok.chat_template is None
    with pytest.raises(EngineError, match="has no tokenizer.json, so this model takes token ids"):
        tok.encode("hello")
    with pytest.raises(EngineError, match="has no tokenizer.json"):
        tok.decode([1, 2])


# --- streaming: one token per byte makes every multi-byte character arrive in pieces ---


@pytest.fixture(scope="module")
def bytewise() -> Tokenizer:
    meta = tiny_gguf_metadata("default", **{"tokenizer.ggml.merges": []})
    return Tokenizer.from_gguf_metadata(meta, "bytes.gguf")


def test_byte_table_matches_the_library():
    assert sorted(BYTE_CHAR.values()) == BYTE_ALPHABET


def test_split_character_appears_once_when_complete(bytewise: Tokenizer):
    ids = bytewise.encode("a€b")
    assert len(ids) == 5  # a, the three bytes of €, b
    assert stream(bytewise, ids) == ["a", "", "", "€", "b", ""]


def test_invalid_bytes_come_out_as_replacement_like_decode(bytewise: Tokenizer):
    stray, lead = bytewise.token_to_id(BYTE_CHAR[0x80]), bytewise.token_to_id(BYTE_CHAR[0xF0])
    assert stray is not None and lead is not None
    ids = [bytewise.encode("x")[0], stray, bytewise.encode("y")[0], lead]
    deltas = stream(bytewise, ids)
    assert deltas == ["x", "", "\ufffdy", "", "\ufffd"]
    assert "".join(deltas) == bytewise.decode(ids) == "x\ufffdy\ufffd"


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.characters(codec="utf-8", exclude_characters="<\ufffd"), max_size=40))
def test_stream_matches_decode_for_any_text(bytewise: Tokenizer, text: str):
    assert_streams_like_decode(bytewise, text)


@pytest.mark.parametrize("text", STREAM_SAMPLES)
def test_stream_samples_bytewise(bytewise: Tokenizer, text: str):
    assert_streams_like_decode(bytewise, text)


def test_stream_work_per_token_is_bounded(bytewise: Tokenizer, monkeypatch: pytest.MonkeyPatch):
    decoded: list[int] = []
    original = bytewise.decode
    monkeypatch.setattr(bytewise, "decode", lambda ids: decoded.append(len(ids)) or original(ids))
    ids = bytewise.encode("a long reply with some ünïcödé 🦙 in it. " * 50)
    assert "".join(stream(bytewise, ids)) == original(ids)
    # A window of a few ids at a time, not the whole growing sequence.
    assert max(decoded) <= 5 and sum(decoded) <= 6 * len(ids)


def test_gguf_qwen35_pre_tokenizer_keeps_combining_marks_with_their_letters():
    """llama.cpp's qwen35 split: [\\p{L}\\p{M}]+ where qwen2 has \\p{L}+ (so a decomposed é
    is one word there and two pieces under qwen2)."""
    words = {}
    for pre in ("qwen2", "qwen35"):
        tok = Tokenizer.from_gguf_metadata(tiny_gguf_metadata(pre), "tiny.gguf")
        words[pre] = [w for w, _ in tok.hf.pre_tokenizer.pre_tokenize_str("cafe\u0301 ok")]
    assert len(words["qwen2"]) == 3 and len(words["qwen35"]) == 2


def test_gguf_unknown_pre_tokenizer_is_refused_by_name():
    with pytest.raises(ModelLoadError, match="'deepseek-llm' is a pre-tokenizer") as err:
        Tokenizer.from_gguf_metadata(tiny_gguf_metadata("deepseek-llm"), "tiny.gguf")
    assert "qwen35" in str(err.value) and "smollm" in str(err.value)
