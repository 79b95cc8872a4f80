"""Token sequences on disk and the batches training draws from them.

A sequences file (`generate` writes it) holds prompt + reply per conversation, flat:
  tokens [total] uint16, offsets [n + 1] int64, reply_start [n] int32 (index in the
  sequence of the first reply token), sampled [n] bool (False: the greedy reply),
  prompt_index [n] int32 (the prompt it answers).
Batches depend only on (seed, step), so a resumed run draws what the first one would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class Sequences:
    tokens: np.ndarray
    offsets: np.ndarray
    reply_start: np.ndarray
    sampled: np.ndarray
    prompt_index: np.ndarray

    def __len__(self) -> int:
        return len(self.reply_start)

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def reply(self, i: int) -> np.ndarray:
        return self.sequence(i)[self.reply_start[i] :]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def save(self, path: str | Path) -> None:
        np.savez_compressed(
            path,
            tokens=self.tokens,
            offsets=self.offsets,
            reply_start=self.reply_start,
            sampled=self.sampled,
            prompt_index=self.prompt_index,
        )

    @classmethod
    def load(cls, path: str | Path) -> Sequences:
        with np.load(path) as f:
            return cls(*(f[k] for k in cls.__dataclass_fields__))

    @classmethod
    def from_lists(
        cls, seqs: list[np.ndarray], reply_start: list[int], sampled: list[bool], prompt: list[int]
    ) -> Sequences:
        lengths = np.array([len(s) for s in seqs], dtype=np.int64)
        return cls(
            tokens=np.concatenate(seqs).astype(
                np.uint16 if max(map(np.max, seqs)) < 1 << 16 else np.uint32
            ),
            offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            reply_start=np.array(reply_start, dtype=np.int32),
            sampled=np.array(sampled, dtype=bool),
            prompt_index=np.array(prompt, dtype=np.int32),
        )


def load_prompts(path: str | Path) -> list[np.ndarray]:
    """The prompt token ids of tools/drafter/prompts.py's file, one array per prompt."""
    with np.load(path) as f:
        tokens, offsets = f["tokens"], f["offsets"]
    return [tokens[offsets[i] : offsets[i + 1]].astype(np.int64) for i in range(len(offsets) - 1)]


def split_heldout(
    prompt_index: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) sequence indices: every reply of a fixed random slice of the
    prompts held out for evaluation. Split by prompt, not by sequence: a held-out reply
    whose prompt's other reply is trained on scores what the drafter memorised of that
    conversation (the shipped run's 2% slice: 112 of its 120 replies)."""
    prompts = np.unique(prompt_index)
    order = np.random.default_rng([seed, 1]).permutation(prompts)
    held = max(1, int(round(len(prompts) * fraction))) if len(prompts) > 1 else 0
    is_held = np.isin(prompt_index, order[:held])
    return np.flatnonzero(~is_held), np.flatnonzero(is_held)


def draft_vocabulary(seqs: Sequences, indices: np.ndarray, size: int) -> tuple[np.ndarray, float]:
    """The `size` most frequent reply tokens over `indices`, sorted by id (ties: lower id),
    and the share of those replies' tokens they cover."""
    counts = np.bincount(np.concatenate([seqs.reply(i) for i in indices]).astype(np.int64))
    ranked = np.lexsort((np.arange(len(counts)), -counts))[: min(size, int((counts > 0).sum()))]
    vocab = np.sort(ranked).astype(np.int32)
    return vocab, float(counts[vocab].sum() / counts.sum())


def coverage(seqs: Sequences, indices: np.ndarray, vocab: np.ndarray) -> float:
    """The share of the replies' tokens over `indices` that `vocab` holds."""
    tokens = np.concatenate([seqs.reply(i) for i in indices])
    return float(np.isin(tokens, vocab).mean())


def concatenate(parts: list[Sequences]) -> Sequences:
    """One sequences file of several, in order; prompt indices kept as they are (each part
    must count its prompts over the same prompt files, in the same order)."""
    seqs, starts, sampled, prompt = [], [], [], []
    for part in parts:
        for n in range(len(part)):
            seqs.append(part.sequence(n))
            starts.append(int(part.reply_start[n]))
            sampled.append(bool(part.sampled[n]))
            prompt.append(int(part.prompt_index[n]))
    return Sequences.from_lists(seqs, starts, sampled, prompt)


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # [N, T] right-padded
    anchors: torch.Tensor  # [N, m] positions of the blocks' pending tokens
    targets: torch.Tensor  # [N, m, B-1] draft-vocabulary index of each row's true token; -100: none
    num_tokens: int  # real (unpadded) tokens in the batch


def make_batch(
    seqs: Sequences,
    indices: np.ndarray,
    vocab_index: np.ndarray,
    block: int,
    anchors_per_seq: int,
    max_len: int,
    rng: np.random.Generator,
) -> Batch:
    """Sequences `indices`, each cut to max_len, with up to anchors_per_seq anchors drawn in
    the reply (a block needs a pending token and at least one token after it). Row j of an
    anchor a is supervised by token a + j; past the end, or outside the draft vocabulary
    (vocab_index[t] == -100), it is ignored."""
    rows = [seqs.sequence(i)[:max_len].astype(np.int64) for i in indices]
    T = max(len(r) for r in rows)
    N, m = len(rows), anchors_per_seq
    tokens = np.zeros((N, T), dtype=np.int64)
    anchors = np.zeros((N, m), dtype=np.int64)
    targets = np.full((N, m, block - 1), -100, dtype=np.int64)
    for n, (i, row) in enumerate(zip(indices, rows, strict=True)):
        tokens[n, : len(row)] = row
        tokens[n, len(row) :] = row[-1]
        candidates = np.arange(max(int(seqs.reply_start[i]), 1), len(row) - 1)
        if len(candidates) == 0:
            continue  # nothing to draft here: every row stays ignored
        chosen = np.sort(rng.choice(candidates, size=min(m, len(candidates)), replace=False))
        anchors[n, : len(chosen)] = chosen
        anchors[n, len(chosen) :] = chosen[0]  # padding blocks, all rows ignored
        for k, a in enumerate(chosen):
            later = row[a + 1 : a + block]
            targets[n, k, : len(later)] = vocab_index[later]
    return Batch(
        tokens=torch.from_numpy(tokens),
        anchors=torch.from_numpy(anchors),
        targets=torch.from_numpy(targets),
        num_tokens=sum(len(r) for r in rows),
    )


def vocab_lookup(vocab: np.ndarray, target_vocab: int) -> np.ndarray:
    """[target_vocab] -> index into the draft vocabulary, -100 for ids outside it."""
    index = np.full(target_vocab, -100, dtype=np.int64)
    index[vocab] = np.arange(len(vocab))
    return index
