"""SentencePiece vocabularies from GGUF metadata, tokenized as llama.cpp does: a tiny
hand-made vocabulary whose splits are worked out by hand, and Gemma 3 270M's against
llama.cpp's own ids (tests/engine/fixtures/gemma3_tokenization.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import model_catalog
from engine.errors import ModelLoadError
from engine.tokenizer import StreamingDetokenizer, Tokenizer

FIXTURE = Path(__file__).parent / "fixtures" / "gemma3_tokenization.json"
BYTES = [f"<0x{b:02X}>" for b in range(256)]


def _spm_meta(pieces: list[tuple[str, float, int]], **extra: Any) -> dict[str, Any]:
    """GGUF-style metadata: <unk>, <s>, </s>, the 256 byte tokens, then `pieces`."""
    head = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    entries = head + [(b, 0.0, 6) for b in BYTES] + pieces
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [t for t, _, _ in entries],
        "tokenizer.ggml.scores": np.array([s for _, s, _ in entries], dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([k for _, _, k in entries], dtype=np.int32),
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        **extra,
    }


# a, b, c, ▁ alone; "ab" outranks "bc", so "abc" splits ab|c, never a|bc; "▁a" outranks "ab"
PIECES = [
    ("a", -10.0, 1),
    ("b", -11.0, 1),
    ("c", -12.0, 1),
    ("\u2581", -13.0, 1),
    ("ab", -2.0, 1),
    ("bc", -3.0, 1),
    ("\u2581a", -1.0, 1),
    ("<tag>", 0.0, 4),
]
FIRST = 3 + 256  # the id of "a"
A, B, C, SPACE, AB, BC, SPACE_A, TAG = range(FIRST, FIRST + len(PIECES))


def test_merges_follow_the_scores_and_spaces_become_the_visible_space() -> None:
    tok = Tokenizer.from_gguf_metadata(
        _spm_meta(PIECES, **{"tokenizer.ggml.add_space_prefix": False}), "tiny.gguf"
    )
    assert tok.encode("abc") == [AB, C]
    assert tok.encode("bc") == [BC]
    assert tok.encode("cab") == [C, AB]
    # " ab": ▁a (score -1) is merged before ab (-2), leaving b alone
    assert tok.encode(" ab") == [SPACE_A, B]
    assert tok.encode("a b") == [A, SPACE, B]


def test_a_space_prefix_is_prepended_only_when_the_file_asks() -> None:
    with_prefix = Tokenizer.from_gguf_metadata(_spm_meta(PIECES), "tiny.gguf")  # default: on
    assert with_prefix.encode("ab") == [SPACE_A, B]
    assert with_prefix.decode([SPACE_A, B]) == "ab"  # the prefix is not shown back
    without = Tokenizer.from_gguf_metadata(
        _spm_meta(PIECES, **{"tokenizer.ggml.add_space_prefix": False}), "tiny.gguf"
    )
    assert without.encode("ab") == [AB]


def test_characters_without_a_piece_fall_back_to_their_utf8_bytes() -> None:
    tok = Tokenizer.from_gguf_metadata(
        _spm_meta(PIECES, **{"tokenizer.ggml.add_space_prefix": False}), "tiny.gguf"
    )
    ids = tok.encode("aé")  # é is C3 A9 in UTF-8
    assert ids == [A, 3 + 0xC3, 3 + 0xA9]
    assert tok.decode(ids) == "aé"
    stream = StreamingDetokenizer(tok)
    assert [stream.add(i) for i in ids] == ["a", "", "é"]  # never half a character


def test_control_tokens_are_special_and_user_defined_ones_are_text() -> None:
    tok = Tokenizer.from_gguf_metadata(
        _spm_meta(PIECES, **{"tokenizer.ggml.add_space_prefix": False}), "tiny.gguf"
    )
    assert tok.encode("a<tag>b</s>") == [A, TAG, B, 2]
    assert tok.is_special(2) and not tok.is_special(TAG)
    assert tok.add_bos  # SentencePiece vocabularies get BOS unless the file says not
    assert tok.encode("a", add_special=True) == [1, A]
    assert 2 in tok.eos_ids


def test_a_sentencepiece_vocabulary_without_scores_is_refused() -> None:
    meta = _spm_meta(PIECES)
    del meta["tokenizer.ggml.scores"]
    with pytest.raises(ModelLoadError, match="lacks tokenizer.ggml.scores"):
        Tokenizer.from_gguf_metadata(meta, "tiny.gguf")


def test_an_unknown_tokenizer_model_is_refused_by_name() -> None:
    meta = {**_spm_meta(PIECES), "tokenizer.ggml.model": "rwkv"}
    with pytest.raises(ModelLoadError, match="tokenizer model 'rwkv' is not supported"):
        Tokenizer.from_gguf_metadata(meta, "tiny.gguf")


# -- Gemma 3 270M against llama.cpp ----------------------------------------------------------


def gguf_metadata(path: Path) -> dict[str, Any]:
    """Every key/value of a GGUF header, read with the gguf package (any tensor types)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    return {key: field.contents() for key, field in reader.fields.items()}


def _gemma_path() -> Path:
    path = model_catalog.GEMMA3_270M.path()
    if path.is_file():
        return path
    pytest.skip("Gemma 3 270M is not fetched (python -m engine fetch gemma3-270m)")


@pytest.fixture(scope="module")
def gemma() -> Tokenizer:
    path = _gemma_path()
    return Tokenizer.from_gguf_metadata(gguf_metadata(path), path)


@pytest.mark.real_model
def test_gemma3_ids_equal_llama_cpp_on_varied_text(gemma: Tokenizer) -> None:
    cases = json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"]
    assert len(cases) >= 60
    mismatched = [c["text"] for c in cases if gemma.encode(c["text"]) != c["ids"]]
    assert mismatched == []


@pytest.mark.real_model
def test_gemma3_decodes_as_llama_cpp_detokenizes(gemma: Tokenizer) -> None:
    cases = json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"]
    for case in cases:
        assert gemma.decode(case["ids"]) == case["detokenized"]
        if "\u2581" not in case["text"]:  # a typed visible space comes back as a space
            assert gemma.decode(gemma.encode(case["text"])) == case["text"]


@pytest.mark.real_model
def test_gemma3_adds_bos_and_stops_on_end_of_turn(gemma: Tokenizer) -> None:
    with_bos = json.loads(FIXTURE.read_text(encoding="utf-8"))["with_bos"]
    assert gemma.encode("Hello world", add_special=True) == with_bos
    end_of_turn = gemma.token_to_id("<end_of_turn>")
    assert end_of_turn is not None and end_of_turn in gemma.eos_ids
    assert gemma.token_to_id("<eos>") in gemma.eos_ids
    assert gemma.vocab_size == 262_144
    assert gemma.chat_template is None  # the base model's file ships none
