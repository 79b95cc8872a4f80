"""Scoring token ids: every position's logits, perplexity as llama.cpp's llama-perplexity
defines it, and how far one model's (or quantization's) distributions are from another's.

Perplexity (llama-perplexity's default): the ids are cut into `len // ctx` chunks of
`ctx` tokens (the tail that does not fill one is dropped), each chunk runs on a fresh
state with its first token replaced by BOS when the model adds one, and only the second
half of each chunk is scored: the logits at positions ctx/2 .. ctx-2 predict the tokens
at ctx/2 + 1 .. ctx-1, so every scored token has at least ctx/2 tokens of context.
PPL = exp(mean negative log-likelihood of the scored tokens).

Against base logits (`--kl-base`): the mean over scored positions of
KL(p_base || p_new) = sum_i p_base(i) (log p_base(i) - log p_new(i)), and the share of
positions where both models' most likely token is the same. The base is kept compact:
its `k` most likely tokens' log-probabilities per position (`CompactLogits`); the KL is
then that of the two distributions coarsened to those k tokens plus one bucket for all
the others. It is exact when k covers the vocabulary (small models are saved whole) and
never above the full KL otherwise (the log-sum inequality).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.runner import ModelRunner
from engine.state import SnapshotPolicy

SCORE_CHUNK = 256  # rows per forward: bounds the activations, the output is written as it comes
TOP_K = 256  # base tokens kept per position; a vocabulary this small is kept whole
ROWS_AT_ONCE = 64  # rows turned into float64 log-probabilities together (memory)
NO_SNAPSHOTS = SnapshotPolicy(stride_capacity=0, marked_capacity=0)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-probabilities in float64: logits [n, V] -> [n, V]."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def perplexity_of(nlls: Sequence[float] | np.ndarray) -> float:
    """exp(mean negative log-likelihood), in nats."""
    values = np.asarray(nlls, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no scored tokens: perplexity is undefined")
    return float(np.exp(values.mean()))


def top_k(logprobs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The k most likely ids per row, likeliest first, their log-probabilities, and the
    log of the probability left to all other ids (-inf when k covers the vocabulary):
    [n, V] -> ([n, k] int32, [n, k] float32, [n] float64)."""
    k = min(k, logprobs.shape[-1])
    ids = np.argpartition(-logprobs, k - 1, axis=-1)[:, :k]
    picked = np.take_along_axis(logprobs, ids, axis=-1)
    order = np.argsort(-picked, axis=-1, kind="stable")
    ids = np.take_along_axis(ids, order, axis=-1)
    picked = np.take_along_axis(picked, order, axis=-1)
    return ids.astype(np.int32), picked.astype(np.float32), _rest_logprob(logprobs, ids)


def _rest_logprob(logprobs: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log sum exp of each row's entries outside `ids` (a sum, not 1 - the top's: exact
    however small the rest is): [n, V], [n, k] -> [n]."""
    outside = np.ones(logprobs.shape, dtype=bool)
    np.put_along_axis(outside, ids.astype(np.int64), False, axis=-1)
    masked = np.where(outside, logprobs, -np.inf)
    peak = masked.max(axis=-1, keepdims=True)
    safe_peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore"):
        return np.asarray(
            (np.log(np.exp(masked - safe_peak).sum(axis=-1, keepdims=True)) + safe_peak)[:, 0]
        )


def coarse_kl(
    base_ids: np.ndarray, base_logprobs: np.ndarray, base_rest: np.ndarray, logprobs: np.ndarray
) -> np.ndarray:
    """KL(base || new) per row over the base's top-k ids plus one bucket for the rest.

    base_ids, base_logprobs [n, k] and base_rest [n] (`top_k`'s); logprobs [n, V] (the new
    model's, whole) -> [n]."""
    p = np.exp(base_logprobs.astype(np.float64))
    new_at_top = np.take_along_axis(logprobs, base_ids.astype(np.int64), axis=-1)
    kl = (p * (base_logprobs - new_at_top)).sum(axis=-1)
    has_rest = np.isfinite(base_rest)
    new_rest = _rest_logprob(logprobs, base_ids)
    with np.errstate(invalid="ignore"):
        rest = np.where(has_rest, np.exp(base_rest) * (base_rest - new_rest), 0.0)
    return np.asarray(kl + rest)


@dataclass(frozen=True)
class CompactLogits:
    """A model's distributions at the scored positions, as `--save-logits` keeps them."""

    token_ids: np.ndarray  # [N] every id the text tokenized to
    ctx: int
    positions: np.ndarray  # [n] indices into token_ids of the scored positions' logits
    top_ids: np.ndarray  # [n, k] int32, likeliest first
    top_logprobs: np.ndarray  # [n, k] float32
    rest_logprobs: np.ndarray  # [n] float64: log of the probability outside the top k
    num_vocab: int

    def save(self, path: str | Path) -> None:
        np.savez_compressed(
            path,
            token_ids=self.token_ids,
            ctx=np.int64(self.ctx),
            positions=self.positions,
            top_ids=self.top_ids,
            top_logprobs=self.top_logprobs,
            rest_logprobs=self.rest_logprobs,
            num_vocab=np.int64(self.num_vocab),
        )

    @classmethod
    def load(cls, path: str | Path) -> CompactLogits:
        with np.load(path) as data:
            names = {"token_ids", "ctx", "positions", "top_ids", "top_logprobs", "rest_logprobs"}
            missing = names - set(data)
            if missing:
                raise ValueError(f"{path} is not a --save-logits file (lacks {sorted(missing)})")
            return cls(
                data["token_ids"],
                int(data["ctx"]),
                data["positions"],
                data["top_ids"],
                data["top_logprobs"],
                data["rest_logprobs"],
                int(data["num_vocab"]),
            )


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    mean_nll: float
    num_tokens: int  # the text's tokens
    num_scored: int
    num_chunks: int
    ctx: int
    mean_kl: float | None = None  # against base logits, when given
    top1_agreement: float | None = None
    compact: CompactLogits | None = None  # what --save-logits writes


def iter_logits(
    runner: ModelRunner, token_ids: Sequence[int], chunk_size: int = SCORE_CHUNK
) -> Iterator[np.ndarray]:
    """The logits of every position, [m, V] float32 blocks in order, on a fresh state."""
    state = runner.new_state(NO_SNAPSHOTS)
    ops = runner.model.ops
    for start in range(0, len(token_ids), chunk_size):
        chunk = [int(t) for t in token_ids[start : start + chunk_size]]
        logits = runner.forward(chunk, state, logits="all")
        yield np.asarray(ops.to_numpy(logits), dtype=np.float32).reshape(len(chunk), -1)


def perplexity(
    runner: ModelRunner,
    token_ids: Sequence[int],
    ctx: int,
    bos_id: int | None,
    base: CompactLogits | None = None,
    keep_top_k: int = TOP_K,
) -> PerplexityResult:
    """llama-perplexity's figure over `token_ids` (see the module docstring)."""
    num_chunks = len(token_ids) // ctx
    if ctx < 4 or num_chunks < 1:
        raise ValueError(
            f"the text holds {len(token_ids)} tokens; perplexity with --ctx {ctx} needs at "
            f"least {max(ctx, 4)} (a smaller --ctx, or a longer text)"
        )
    if base is not None and (base.ctx != ctx or not np.array_equal(base.token_ids, token_ids)):
        raise ValueError(
            "the base logits were saved for other tokens or another --ctx "
            f"({len(base.token_ids)} tokens, ctx {base.ctx}; here {len(token_ids)}, ctx {ctx}): "
            "compare the same text with the same tokenizer and --ctx"
        )
    num_vocab = runner.model.config.vocab_size
    if base is not None and base.num_vocab != num_vocab:
        raise ValueError(
            f"the base logits have {base.num_vocab} vocabulary entries, this model "
            f"{num_vocab}: KL needs the same vocabulary"
        )
    first = ctx // 2
    nlls, positions, kls, agree, kept_ids, kept_logprobs, kept_rest = [], [], [], [], [], [], []
    num_done = 0  # scored rows so far: where this block's rows sit in the base's
    for c in range(num_chunks):
        chunk = list(token_ids[c * ctx : (c + 1) * ctx])
        if bos_id is not None:
            chunk[0] = bos_id
        offset = 0
        for block in iter_logits(runner, chunk):
            # the rows of this block that predict a scored token: positions first .. ctx-2
            lo, hi = max(first, offset), min(ctx - 1, offset + len(block))
            offset += len(block)
            for row in range(lo, hi, ROWS_AT_ONCE):
                end = min(hi, row + ROWS_AT_ONCE)
                offset_in_block = row - (offset - len(block))
                logprobs = log_softmax(block[offset_in_block : offset_in_block + end - row])
                targets = np.asarray(chunk[row + 1 : end + 1])
                nlls.append(-logprobs[np.arange(len(targets)), targets])
                positions.append(c * ctx + np.arange(row, end))
                ids, lps, rest = top_k(logprobs, keep_top_k)
                kept_ids.append(ids)
                kept_logprobs.append(lps)
                kept_rest.append(rest)
                if base is not None:
                    rows = slice(num_done, num_done + len(targets))
                    kls.append(
                        coarse_kl(
                            base.top_ids[rows],
                            base.top_logprobs[rows],
                            base.rest_logprobs[rows],
                            logprobs,
                        )
                    )
                    agree.append(ids[:, 0] == base.top_ids[rows, 0])
                num_done += len(targets)
    nll = np.concatenate(nlls)
    compact = CompactLogits(
        np.asarray(token_ids, dtype=np.int32),
        ctx,
        np.concatenate(positions).astype(np.int64),
        np.concatenate(kept_ids),
        np.concatenate(kept_logprobs),
        np.concatenate(kept_rest),
        num_vocab,
    )
    return PerplexityResult(
        perplexity=perplexity_of(nll),
        mean_nll=float(nll.mean()),
        num_tokens=len(token_ids),
        num_scored=len(nll),
        num_chunks=num_chunks,
        ctx=ctx,
        mean_kl=float(np.concatenate(kls).mean()) if base is not None else None,
        top1_agreement=float(np.concatenate(agree).mean()) if base is not None else None,
        compact=compact,
    )
