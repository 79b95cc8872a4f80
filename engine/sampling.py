"""Sampling: logits -> a probability vector through the usual transforms, then a draw.

Temperature 0 is greedy (argmax, no randomness). Otherwise the token at position t of
the sequence is drawn by inverse CDF from one uniform that depends on the seed and t
alone (`PositionalUniforms`), never on how many draws came before: so a speculative
verify, which samples several positions from one batched pass, draws exactly the tokens
plain decoding would (coupled sampling; see engine/decoding.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_context: int = 64  # how many recent tokens the penalty looks at
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0 <= self.min_p < 1:
            raise ValueError("min_p must be in [0, 1)")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.seed is not None and self.seed < 0:
            raise ValueError("seed must be >= 0")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def penalize(logits: np.ndarray, history: Sequence[int], s: SamplingSettings) -> np.ndarray:
    """CTRL-style repetition penalty over the last `repetition_context` tokens."""
    if s.repetition_penalty == 1.0 or not history:
        return logits
    out = np.array(logits, dtype=np.float64)
    recent = np.unique(np.asarray(history[-s.repetition_context :], dtype=np.int64))
    vals = out[recent]
    out[recent] = np.where(vals > 0, vals / s.repetition_penalty, vals * s.repetition_penalty)
    return out


def probabilities(logits: np.ndarray, history: Sequence[int], s: SamplingSettings) -> np.ndarray:
    """The distribution a token is drawn from (float64, sums to 1). Greedy: one-hot."""
    x = penalize(np.asarray(logits, dtype=np.float64), history, s)
    if s.is_greedy:
        p = np.zeros_like(x)
        p[int(np.argmax(x))] = 1.0
        return p
    ids, w = _candidates(x, s)
    p = np.zeros_like(x)
    p[ids if ids is not None else slice(None)] = w
    return p / p.sum()


def _candidates(x: np.ndarray, s: SamplingSettings) -> tuple[np.ndarray | None, np.ndarray]:
    """The tokens a draw can give and their unnormalised weights, from (penalised) float64
    logits: temperature, then top-k, min-p and top-p. (ascending indices into x, their
    weights) where top-p leaves a few; (None, a weight per entry of x) otherwise."""
    x = x / s.temperature
    x -= x.max()
    p = np.exp(x)
    if s.top_k and s.top_k < p.size:
        kth = np.partition(p, -s.top_k)[-s.top_k]
        p[p < kth] = 0.0
    if s.min_p > 0:
        p[p < s.min_p * p.max()] = 0.0
    if s.top_p < 1.0:
        kept = _nucleus(p, s.top_p)
        return kept, p[kept]
    return None, p


# Candidates first: tokens within these factors of the likeliest one, then the whole
# vocabulary. Every token left out is less likely than every candidate, so when the
# candidates hold top_p of the mass the nucleus is among them, in the same order.
NUCLEUS_FLOORS = (2.0**-10, 2.0**-24)


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """The smallest set of likeliest tokens reaching `top_p` of p's mass, as ascending
    indices. The set is usually a few dozen tokens of a vocabulary of tens of thousands,
    so only the tokens within a factor of the likeliest are sorted (one comparison over
    the vocabulary, ~10x cheaper than partitioning it), a wider factor if they hold too
    little mass, the whole vocabulary last: the same set a full sort gives."""
    total, top = p.sum(), p.max()
    for floor in (*NUCLEUS_FLOORS, 0.0):
        if floor:
            candidates = np.flatnonzero(p >= top * floor)
            order = candidates[np.argsort(-p[candidates])]
        else:
            order = np.argsort(-p)
        cum = np.cumsum(p[order]) / total
        if cum[-1] >= top_p:
            break
    cut = int(np.searchsorted(cum, top_p)) + 1  # keep the smallest prefix reaching top_p
    return np.sort(order[:cut])


def greedy(logits: np.ndarray, history: Sequence[int], s: SamplingSettings) -> int:
    return int(np.argmax(penalize(np.asarray(logits), history, s)))


class PositionalUniforms:
    """One uniform in [0, 1) per position of a sequence, a function of (seed, position).

    Each is the first word of numpy's SeedSequence with the position as its spawn key
    (the hashing numpy uses to derive independent streams), so uniforms at different
    positions are independent, and the same seed gives the same uniform at a position
    however the decode loop got there. Without a seed, fresh entropy per request.
    """

    # positions whose uniforms are kept: a queued sampled step asks for its position's
    # uniform for the device's draw, the host's draw asks again a step later, and a
    # SeedSequence costs ~6 us (an Intel Xeon)
    KEPT = 8

    def __init__(self, seed: int | None) -> None:
        self.entropy = np.random.SeedSequence(seed).entropy
        self._kept: dict[int, float] = {}

    def uniform(self, position: int) -> float:
        u = self._kept.get(position)
        if u is None:
            seq = np.random.SeedSequence(self.entropy, spawn_key=(position,))
            word = int(seq.generate_state(1, np.uint64)[0])
            u = (word >> 11) * 2.0**-53  # the top 53 bits: every double in [0, 1) reachable
            if len(self._kept) >= self.KEPT:
                del self._kept[next(iter(self._kept))]  # the oldest asked for
            self._kept[position] = u
        return u


def draw(p: np.ndarray, u: float) -> int:
    """The index at uniform `u` of the inverse CDF of p (unnormalised weights, float64):
    the first whose running sum passes u of the total. A zero weight adds nothing to a
    running sum, so drawing among a distribution's nonzero entries alone (in their
    order) gives the same token."""
    cdf = np.cumsum(p)
    at = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return at if at < p.size else int(np.flatnonzero(p)[-1])  # u * total rounded up to it


def _draw_among(ids: np.ndarray | None, w: np.ndarray, u: float) -> int:
    at = draw(w, u)
    return at if ids is None else int(ids[at])


def sample(
    logits: np.ndarray, history: Sequence[int], s: SamplingSettings, uniforms: PositionalUniforms
) -> int:
    """The token that follows `history` (it goes to position len(history))."""
    if s.is_greedy:
        return greedy(logits, history, s)
    x = penalize(np.asarray(logits, dtype=np.float64), history, s)
    return _draw_among(*_candidates(x, s), uniforms.uniform(len(history)))


def sample_among(
    logits: np.ndarray,
    ids: np.ndarray,
    history: Sequence[int],
    s: SamplingSettings,
    uniforms: PositionalUniforms,
) -> int:
    """`sample` of a row whose logits outside `ids` (ascending token ids) are -inf, from
    those `len(ids)` entries alone: the same distribution, the same uniform, and no
    vocabulary-wide row built (a drafter proposing over its own vocabulary)."""
    x = np.array(logits, dtype=np.float64)
    if s.repetition_penalty != 1.0 and history:
        recent = np.unique(np.asarray(history[-s.repetition_context :], dtype=np.int64))
        at = np.minimum(np.searchsorted(ids, recent), len(ids) - 1)
        at = at[ids[at] == recent]  # the recent tokens that are among `ids`
        vals = x[at]
        x[at] = np.where(vals > 0, vals / s.repetition_penalty, vals * s.repetition_penalty)
    if s.is_greedy:
        return int(ids[int(np.argmax(x))])
    return int(ids[_draw_among(*_candidates(x, s), uniforms.uniform(len(history)))])


@dataclass(frozen=True)
class CoupledSampler:
    """A request's own draw (`sample`) handed to a drafter, so its proposals use the
    request's uniforms; `among` draws over a drafter's own vocabulary."""

    settings: SamplingSettings
    uniforms: PositionalUniforms

    def __call__(self, logits: np.ndarray, history: Sequence[int]) -> int:
        return sample(logits, history, self.settings, self.uniforms)

    def among(self, logits: np.ndarray, ids: np.ndarray, history: Sequence[int]) -> int:
        return sample_among(logits, ids, history, self.settings, self.uniforms)
