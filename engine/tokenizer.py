"""Text <-> token ids for a model, built from GGUF metadata or a Hugging Face tokenizer.json.

The BPE itself is the Hugging Face `tokenizers` library; this module only assembles it the
way llama.cpp does for a GGUF file (which pre-tokenizer regex goes with which
`tokenizer.ggml.pre` name, a SentencePiece vocabulary's merges from its scores, which
tokens are special, whether to add BOS), and adds a
streaming detokenizer that never shows half a character.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from engine.errors import EngineError, ModelLoadError
from engine.tokenizer_dir import (
    chat_template,
    generation_eos_ids,
    missing_tokenizer_problem,
    read_json,
    token_text,
)
from engine.tokenizer_spm import build_spm

# GGUF token types (llama.cpp's llama_token_type): 3 = control, 4 = user-defined.
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# llama.cpp's llama-vocab.cpp regexes; its engine lacks `(?i:...)`, so contractions are spelt
# out per letter. GPT-4 style (llama 3) groups digits by three, qwen2 splits every digit.
_LLAMA3_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5 keeps combining marks (\p{M}) with their letters.
_QWEN35_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+"
    r"|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` names grouped as llama.cpp groups them.
_LLAMA3_NAMES = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx"})
_QWEN2_NAMES = frozenset({"qwen2", "stablelm2", "hunyuan", "deepseek-r1-qwen"})
_DIGIT_NAMES = frozenset({"smollm", "starcoder", "refact", "codeshell", "command-r"})
_QWEN35_NAMES = frozenset({"qwen35"})
_GPT2_NAMES = frozenset({"default", "gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais"})
_REGEXES = {
    **dict.fromkeys(_LLAMA3_NAMES, _LLAMA3_REGEX),
    **dict.fromkeys(_QWEN2_NAMES, _QWEN2_REGEX),
    **dict.fromkeys(_QWEN35_NAMES, _QWEN35_REGEX),
}
KNOWN_PRE_TOKENIZERS = sorted(_DIGIT_NAMES | _GPT2_NAMES | _REGEXES.keys())

# Special tokens that end a turn, as llama.cpp collects its end-of-generation set: a model
# may emit any of these instead of its declared EOS, and generation must stop on each.
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
)


def _pre_tokenizer(pre: str) -> tuple[pre_tokenizers.PreTokenizer, bool]:
    """The pre-tokenizer for a `tokenizer.ggml.pre` name, and whether BPE ignores merges."""
    if pre in _DIGIT_NAMES:
        # Verified token-for-token against llama.cpp on SmolLM2: "\p{N}" then the gpt2 regex.
        digits = pre_tokenizers.Digits(individual_digits=True)
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
        return pre_tokenizers.Sequence([digits, byte_level]), False
    if pre in _REGEXES:
        split = pre_tokenizers.Split(Regex(_REGEXES[pre]), behavior="isolated")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        return pre_tokenizers.Sequence([split, byte_level]), pre in _LLAMA3_NAMES
    if pre not in _GPT2_NAMES:
        # llama.cpp refuses an unknown name too: another split would give other ids, and the
        # model would answer plausible nonsense
        raise ValueError(
            f"tokenizer.ggml.pre {pre!r} is a pre-tokenizer this app does not implement "
            f"(implemented: {', '.join(KNOWN_PRE_TOKENIZERS)})"
        )
    return pre_tokenizers.ByteLevel(add_prefix_space=False), False


def _scalar(value: Any) -> Any:
    """A python value from a GGUF metadata entry (mlx scalars carry `.item()`)."""
    return value.item() if hasattr(value, "item") else value


class Tokenizer:
    """A model's tokenizer: encode, decode, and which ids are BOS, end-of-turn or special.

    `eos_ids` holds every id that should stop generation: the declared EOS, any listed in
    generation_config.json, and the special tokens named in END_OF_TURN_TOKENS.
    """

    def __init__(
        self,
        hf: tokenizers.Tokenizer,
        *,
        bos_id: int | None,
        eos_id: int | None,
        add_bos: bool,
        chat_template: str | None,
        extra_eos_ids: Iterable[int] = (),
        text_problem: str = "",
    ) -> None:
        """text_problem: why this tokenizer cannot turn text into ids or back (a folder
        without tokenizer.json: token ids only); "" when it can."""
        self.hf = hf
        self.text_problem = text_problem
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        added = hf.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, token in added.items() if token.special)
        # Every id that ends generation: the declared EOS(es) plus special end-of-turn tokens.
        turn_ends = [hf.token_to_id(text) for text in END_OF_TURN_TOKENS]
        self.eos_ids: frozenset[int] = frozenset(
            [*([] if eos_id is None else [eos_id]), *extra_eos_ids]
            + [i for i in turn_ends if i in self._special_ids]
        )

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], path: object) -> Tokenizer:
        """Build from a GGUF file's key/value metadata: byte-level BPE ("gpt2") or
        SentencePiece ("llama", engine/tokenizer_spm.py), as llama.cpp tokenizes them."""

        def need(key: str) -> Any:
            if key not in meta:
                raise ModelLoadError(path, f"GGUF metadata lacks {key}; cannot build the tokenizer")
            return meta[key]

        model_kind = str(need("tokenizer.ggml.model"))
        if model_kind not in ("gpt2", "llama"):
            raise ModelLoadError(
                path,
                f"tokenizer model {model_kind!r} is not supported (only 'gpt2' byte-level BPE "
                "and 'llama' SentencePiece)",
            )
        tokens = [str(t) for t in need("tokenizer.ggml.tokens")]
        types = np.asarray(meta.get("tokenizer.ggml.token_type", np.ones(len(tokens)))).tolist()
        if len(types) != len(tokens):
            raise ModelLoadError(path, f"{len(types)} token types for {len(tokens)} tokens")
        pre = str(meta.get("tokenizer.ggml.pre", "default"))
        if model_kind == "llama":
            hf = _sentencepiece(meta, tokens, types, path)
        else:
            try:
                hf = _byte_level_bpe(need("tokenizer.ggml.merges"), tokens, types, pre)
            except ValueError as exc:
                raise ModelLoadError(path, str(exc)) from None

        bos = meta.get("tokenizer.ggml.bos_token_id")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        add_bos = meta.get("tokenizer.ggml.add_bos_token")
        template = meta.get("tokenizer.chat_template")
        return cls(
            hf,
            bos_id=None if bos is None else int(_scalar(bos)),
            eos_id=None if eos is None else int(_scalar(eos)),
            # llama.cpp adds BOS for SentencePiece and the llama 3 family unless the file
            # says otherwise.
            add_bos=(model_kind == "llama" or pre in _LLAMA3_NAMES)
            if add_bos is None
            else bool(_scalar(add_bos)),
            chat_template=template if isinstance(template, str) else None,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Build from a Hugging Face model directory (tokenizer.json and its config files)."""
        directory = Path(path)
        config = read_json(directory / "tokenizer_config.json")
        text_problem = missing_tokenizer_problem(directory)
        if text_problem and (directory / "tokenizer.model").is_file():
            # converting a SentencePiece model takes transformers and cannot be checked here
            raise ModelLoadError(
                directory,
                "only a SentencePiece tokenizer.model here, no tokenizer.json; write one with "
                "transformers (AutoTokenizer.from_pretrained(folder).save_pretrained(folder)) "
                "or load the model's GGUF",
            )
        if text_problem:
            ids_only = tokenizers.Tokenizer(models.BPE())
            eos = config.get("eos_token_id")
            return cls(
                ids_only,
                bos_id=None,
                eos_id=eos if isinstance(eos, int) else None,
                add_bos=False,
                chat_template=None,
                extra_eos_ids=generation_eos_ids(directory),
                text_problem=text_problem,
            )
        try:
            hf = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as e:  # the library raises a bare Exception on malformed JSON
            raise ModelLoadError(directory / "tokenizer.json", f"unreadable: {e}") from e

        bos_text = token_text(config.get("bos_token"))
        bos_id = hf.token_to_id(bos_text) if bos_text else None
        eos_text = token_text(config.get("eos_token"))
        eos_id = hf.token_to_id(eos_text) if eos_text else None
        add_bos = config.get("add_bos_token")
        if add_bos is None:
            # No flag: trust tokenizer.json's post-processor (llama 3 adds BOS there).
            empty = hf.encode("", add_special_tokens=True).ids
            add_bos = bos_id is not None and empty[:1] == [bos_id]
        return cls(
            hf,
            bos_id=bos_id,
            eos_id=eos_id,
            add_bos=bool(add_bos),
            chat_template=chat_template(directory, config),
            extra_eos_ids=generation_eos_ids(directory),
        )

    @property
    def vocab_size(self) -> int:
        return int(self.hf.get_vocab_size(with_added_tokens=True))

    @property
    def bos_token(self) -> str:
        """BOS as text, for chat templates ("" when the model has none)."""
        return "" if self.bos_id is None else self.id_to_token(self.bos_id) or ""

    @property
    def eos_token(self) -> str:
        """The declared EOS as text, for chat templates ("" when the model has none)."""
        return "" if self.eos_id is None else self.id_to_token(self.eos_id) or ""

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids for text; special-token text in it (e.g. "<|im_start|>") becomes its id.

        add_special prepends BOS when the model wants one (`add_bos`). A byte with no token in
        the vocabulary (SmolLM2 lacks a few control bytes) is dropped, as llama.cpp does.
        """
        self._check_text()
        ids: list[int] = self.hf.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        return ids

    def encode_with_ends(self, text: str, add_special: bool = False) -> tuple[list[int], list[int]]:
        """Token ids for text plus, per token, the character offset where it ends."""
        self._check_text()
        enc = self.hf.encode(text, add_special_tokens=False)
        ids, ends = list(enc.ids), [end for _, end in enc.offsets]
        if add_special and self.add_bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
            ends.insert(0, 0)
        return ids, ends

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text for ids; bytes that are not valid UTF-8 come out as U+FFFD."""
        self._check_text()
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special))

    def _check_text(self) -> None:
        if self.text_problem:
            raise EngineError(self.text_problem)

    def check_fits(self, num_embedding_rows: int, path: object) -> None:
        """Refuse, at load, a vocabulary with ids past the embedding's rows: they would
        fail at the first prompt that uses them ("index out of bounds")."""
        ids = self.hf.get_vocab(with_added_tokens=True).values()
        num_ids = max(ids, default=-1) + 1
        if num_ids > num_embedding_rows:
            raise ModelLoadError(
                path,
                f"the tokenizer's vocabulary has {num_ids} token ids but the model's embedding has "
                f"{num_embedding_rows} rows: they do not belong together",
            )

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry (byte-level form, e.g. "Ġworld") or None if out of range."""
        token: str | None = self.hf.id_to_token(token_id)
        return token

    def token_to_id(self, token: str) -> int | None:
        token_id: int | None = self.hf.token_to_id(token)
        return token_id

    def is_special(self, token_id: int) -> bool:
        """Whether the id is a control token (chat tags, BOS/EOS), not ordinary text."""
        return token_id in self._special_ids


def _byte_level_bpe(
    merge_lines: Iterable[str], tokens: list[str], types: list[int], pre: str
) -> tokenizers.Tokenizer:
    # Each merge is "left right"; byte-level tokens never hold a space, so the first splits.
    pairs = (m.split(" ", 1) for m in merge_lines)
    merges = [(left, right) for left, right in pairs]
    pre_tokenizer, ignore_merges = _pre_tokenizer(pre)
    vocab = {text: i for i, text in enumerate(tokens)}
    hf = tokenizers.Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
    hf.pre_tokenizer = pre_tokenizer
    hf.decoder = decoders.ByteLevel()
    # Control tokens are special; user-defined ones are matched in text but shown as text.
    hf.add_tokens(
        [
            AddedToken(text, special=token_type == TOKEN_TYPE_CONTROL, normalized=False)
            for text, token_type in zip(tokens, types, strict=True)
            if token_type in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
        ]
    )
    return hf


def _sentencepiece(
    meta: Mapping[str, Any], tokens: list[str], types: list[int], path: object
) -> tokenizers.Tokenizer:
    if "tokenizer.ggml.scores" not in meta:
        raise ModelLoadError(path, "GGUF metadata lacks tokenizer.ggml.scores (SentencePiece)")
    scores = np.asarray(meta["tokenizer.ggml.scores"], dtype=np.float64)
    if len(scores) != len(tokens):
        raise ModelLoadError(path, f"{len(scores)} token scores for {len(tokens)} tokens")
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    space_prefix = meta.get("tokenizer.ggml.add_space_prefix")
    return build_spm(
        tokens,
        scores,
        types,
        unk_id=None if unk is None else int(_scalar(unk)),
        # llama.cpp's default for SentencePiece vocabularies is to prepend a space
        add_space_prefix=True if space_prefix is None else bool(_scalar(space_prefix)),
    )


class StreamingDetokenizer:
    """Turns ids arriving one at a time into text deltas that never split a character.

    A window of ids is decoded at each step, starting one id before the last point where
    the text was whole; that id is context only (it keeps decoders that strip a leading
    space honest) and its text is not emitted again. Trailing U+FFFD is held back until the
    next id either completes the character or proves it invalid, or until `flush`.
    The deltas joined equal `tokenizer.decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._window: list[int] = []
        self._num_emitted = 0  # characters of decode(self._window) already returned

    def add(self, token_id: int) -> str:
        """Add one id; return the text it completes ("" while a character is unfinished)."""
        self._window.append(token_id)
        text = self.tokenizer.decode(self._window)
        whole = text.rstrip("\ufffd")
        delta = whole[self._num_emitted :]
        self._num_emitted = max(self._num_emitted, len(whole))
        if whole == text and len(self._window) > 1:
            # Text is whole here: restart the window at the last id, kept as context.
            self._window = self._window[-1:]
            self._num_emitted = len(self.tokenizer.decode(self._window))
        return delta

    def flush(self) -> str:
        """Return whatever was held back (invalid bytes come out as U+FFFD) and reset."""
        delta = self.tokenizer.decode(self._window)[self._num_emitted :]
        self._window, self._num_emitted = [], 0
        return delta
