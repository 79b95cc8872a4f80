"""Sampling: logits -> a probability vector through the usual transforms, then a draw.

The same `probabilities` serves plain decoding and both sides of speculative rejection
sampling (the target's p and a draft model's q), so the transforms always agree.
Temperature 0 is greedy (argmax, no randomness).
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
    x = x / s.temperature
    x -= x.max()
    p = np.exp(x)
    if s.top_k and s.top_k < p.size:
        kth = np.partition(p, -s.top_k)[-s.top_k]
        p[p < kth] = 0.0
    if s.min_p > 0:
        p[p < s.min_p * p.max()] = 0.0
    if s.top_p < 1.0:
        order = np.argsort(-p)
        cum = np.cumsum(p[order]) / p.sum()
        cut = int(np.searchsorted(cum, s.top_p)) + 1  # keep the smallest prefix reaching top_p
        p[order[cut:]] = 0.0
    return p / p.sum()


def greedy(logits: np.ndarray, history: Sequence[int], s: SamplingSettings) -> int:
    return int(np.argmax(penalize(np.asarray(logits), history, s)))


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One token from p by inverse CDF (exact for float64 p)."""
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), p.size - 1))


def sample(
    logits: np.ndarray, history: Sequence[int], s: SamplingSettings, rng: np.random.Generator
) -> int:
    if s.is_greedy:
        return greedy(logits, history, s)
    return draw(probabilities(logits, history, s), rng)
