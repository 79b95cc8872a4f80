"""A SentencePiece vocabulary from GGUF metadata (`tokenizer.ggml.model` "llama"), built
as a `tokenizers` BPE that splits text exactly as llama.cpp's SPM tokenizer does.

llama.cpp (llm_tokenizer_spm) starts from one symbol per character, repeatedly merges the
adjacent pair whose joined text is a vocabulary piece with the highest score (the leftmost
on a tie), and spells a symbol no piece covers as byte tokens <0xNN>. A BPE whose merges
are every (left, right) split of every piece, ranked by the joined piece's score, does the
same merges in the same order; `byte_fallback` is the <0xNN> spelling. Spaces become "▁"
(U+2581) first, with one prepended only when `add_space_prefix` says so (Gemma 3: no).
Control and user-defined pieces are matched in the raw text before any of that, as
llama.cpp partitions them out; they are never merge targets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers

SPACE = "\u2581"  # SentencePiece's visible space
# GGUF token types (llama.cpp's llama_token_type)
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = (
    1,
    2,
    3,
    4,
    5,
    6,
)


def spm_merges(
    tokens: Sequence[str], scores: np.ndarray, types: np.ndarray
) -> list[tuple[str, str]]:
    """Every split of every normal piece into two pieces, the highest-scoring piece's first.

    Ties keep the piece's id order, then the split point (left shorter first)."""
    kinds, piece_scores = types.tolist(), scores.tolist()  # plain lists: 10x faster to index
    vocab = {t: i for i, t in enumerate(tokens) if kinds[i] in (TYPE_NORMAL, TYPE_BYTE)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, i in vocab.items():
        if kinds[i] != TYPE_NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left = piece[:cut]
            if left in vocab and piece[cut:] in vocab:
                ranked.append((-piece_scores[i], i, cut, left, piece[cut:]))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def build_spm(
    tokens: Sequence[str],
    scores: Sequence[float] | np.ndarray,
    types: Sequence[int] | np.ndarray,
    *,
    unk_id: int | None,
    add_space_prefix: bool,
) -> tokenizers.Tokenizer:
    """The `tokenizers` object for a SentencePiece vocabulary, as llama.cpp tokenizes it."""
    scores = np.asarray(scores, dtype=np.float64)
    types = np.asarray(types, dtype=np.int64)
    vocab = {text: i for i, text in enumerate(tokens)}
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    bpe = models.BPE(
        vocab,
        spm_merges(tokens, scores, types),
        unk_token=unk,
        fuse_unk=True,
        byte_fallback=True,
    )
    hf = tokenizers.Tokenizer(bpe)
    steps: list[normalizers.Normalizer] = []
    if add_space_prefix:
        steps.append(normalizers.Prepend(SPACE))
    steps.append(normalizers.Replace(" ", SPACE))
    hf.normalizer = normalizers.Sequence(steps)
    decode_steps: list[decoders.Decoder] = [
        decoders.Replace(SPACE, " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
    ]
    if add_space_prefix:
        decode_steps.append(decoders.Strip(" ", 1, 0))
    hf.decoder = decoders.Sequence(decode_steps)
    hf.add_tokens(
        [
            AddedToken(text, special=token_type == TYPE_CONTROL, normalized=False)
            for text, token_type in zip(tokens, types.tolist(), strict=True)
            if token_type in (TYPE_CONTROL, TYPE_USER_DEFINED)
        ]
    )
    return hf
