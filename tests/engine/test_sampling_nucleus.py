"""Top-p keeps exactly the set a sort of the whole vocabulary keeps, whether the nucleus
is a handful of tokens (found among the likeliest 64), a thousand, or nearly everything."""

from __future__ import annotations

import numpy as np
import pytest

from engine.sampling import SamplingSettings, _nucleus, probabilities


def nucleus_by_full_sort(p: np.ndarray, top_p: float) -> np.ndarray:
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order]) / p.sum()
    cut = int(np.searchsorted(cum, top_p)) + 1
    out = np.zeros_like(p)
    out[order[:cut]] = p[order[:cut]]
    return out


@pytest.mark.parametrize("scale", [0.1, 1.0, 3.0, 12.0])  # flat .. peaked
@pytest.mark.parametrize("vocab", [8, 64, 65, 3000, 49152])
def test_the_nucleus_equals_a_full_sorts(scale: float, vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    for top_p in (0.05, 0.5, 0.9, 0.95, 0.999):
        p = np.exp(rng.standard_normal(vocab) * scale)
        p[rng.random(vocab) < 0.3] = 0.0  # as after top-k / min-p
        p[0] = max(p[0], 1e-3)
        want = nucleus_by_full_sort(p, top_p)
        got = _nucleus(p, top_p)
        np.testing.assert_array_equal(got, want)


def test_top_p_through_probabilities() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    p = probabilities(logits, [], SamplingSettings(temperature=1.0, top_p=0.7))
    np.testing.assert_allclose(p, [0.625, 0.375, 0.0, 0.0])
