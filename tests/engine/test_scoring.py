"""The scoring arithmetic on distributions whose figures are known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.scoring import coarse_kl, log_softmax, perplexity_of, top_k


def test_a_uniform_distribution_has_the_vocabulary_size_as_perplexity() -> None:
    logprobs = log_softmax(np.zeros((5, 1000), dtype=np.float32))
    nll = -logprobs[np.arange(5), [0, 7, 99, 500, 999]]
    assert perplexity_of(nll) == pytest.approx(1000.0, rel=1e-12)


def test_perplexity_of_a_known_distribution() -> None:
    # p = (1/2, 1/4, 1/4); the three outcomes once each: exp(mean(ln 2, ln 4, ln 4)) = 32^(1/3)
    logits = np.log(np.array([[0.5, 0.25, 0.25]] * 3)) + 7.0  # a shift changes nothing
    nll = -log_softmax(logits)[np.arange(3), [0, 1, 2]]
    assert perplexity_of(nll) == pytest.approx(32 ** (1 / 3), rel=1e-12)


def test_no_scored_token_is_refused() -> None:
    with pytest.raises(ValueError, match="no scored tokens"):
        perplexity_of([])


def test_top_k_is_likeliest_first() -> None:
    logprobs = log_softmax(np.array([[0.0, 3.0, 1.0, 2.0], [5.0, 1.0, 4.0, 0.0]]))
    ids, lps, rest = top_k(logprobs, 3)
    assert ids.tolist() == [[1, 3, 2], [0, 2, 1]]
    assert np.allclose(lps, np.take_along_axis(logprobs, ids.astype(int), axis=-1))
    assert np.allclose(rest, [logprobs[0, 0], logprobs[1, 3]])  # the one id left out
    assert np.all(np.isneginf(top_k(logprobs, 4)[2]))  # nothing left out


def test_kl_of_identical_logits_is_zero_and_of_a_whole_vocabulary_exact() -> None:
    rng = np.random.default_rng(0)
    p = log_softmax(rng.normal(size=(4, 50)) * 3)
    q = log_softmax(rng.normal(size=(4, 50)) * 3)
    ids, lps, rest = top_k(p, 50)  # the whole vocabulary: no bucket, the exact KL
    assert np.abs(coarse_kl(ids, lps, rest, p)).max() < 1e-6  # float32 log-probs kept
    exact = (np.exp(p) * (p - q)).sum(axis=-1)
    assert np.allclose(coarse_kl(ids, lps, rest, q), exact, atol=1e-6)
    ids, lps, rest = top_k(p, 10)
    assert np.abs(coarse_kl(ids, lps, rest, p)).max() < 1e-6


def test_kl_over_the_top_k_is_that_of_the_coarsened_distributions() -> None:
    p = np.log(np.array([[0.6, 0.2, 0.1, 0.1]]))
    q = np.log(np.array([[0.3, 0.3, 0.3, 0.1]]))
    ids, lps, rest = top_k(p, 2)  # tokens 0 and 1, then a bucket of 0.2 (p) and 0.4 (q)
    expected = 0.6 * math.log(0.6 / 0.3) + 0.2 * math.log(0.2 / 0.3) + 0.2 * math.log(0.2 / 0.4)
    assert coarse_kl(ids, lps, rest, q)[0] == pytest.approx(expected, rel=1e-6)
    full = float((np.exp(p) * (p - q)).sum())
    assert coarse_kl(ids, lps, rest, q)[0] <= full + 1e-12
