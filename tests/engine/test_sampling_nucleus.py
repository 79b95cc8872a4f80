"""Top-p keeps exactly the set a sort of the whole vocabulary keeps, whether the nucleus
is a handful of tokens (found near the likeliest), a thousand, or nearly everything."""

from __future__ import annotations

import numpy as np
import pytest

from engine.sampling import SamplingSettings, _nucleus, draw, probabilities


def nucleus_by_full_sort(p: np.ndarray, top_p: float) -> np.ndarray:
    """The kept tokens' ids, ascending."""
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order]) / p.sum()
    cut = int(np.searchsorted(cum, top_p)) + 1
    return np.sort(order[:cut])


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


@pytest.mark.parametrize("tail", [1e-4, 1e-8])  # under the first floor; under both
def test_a_long_tail_under_the_floors_is_sorted_too(tail: float) -> None:
    """One likely token over 49,151 unlikely ones: the likeliest token's neighbourhood
    holds too little mass, so the wider floor (tail 1e-4: 83% of the mass) or the whole
    vocabulary (tail 1e-8, under 2^-24 of the top) is sorted; the same set as a full sort."""
    rng = np.random.default_rng(7)
    p = tail * (1 + 0.5 * rng.random(49152))
    p[123] = 1.0
    assert p[p < 2.0**-10].sum() > 0.5 * p.sum() or tail < 2.0**-24
    for top_p in (0.5, 0.99, 0.9999999):
        np.testing.assert_array_equal(_nucleus(p, top_p), nucleus_by_full_sort(p, top_p))


def test_top_p_through_probabilities() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    p = probabilities(logits, [], SamplingSettings(temperature=1.0, top_p=0.7))
    np.testing.assert_allclose(p, [0.625, 0.375, 0.0, 0.0])


@pytest.mark.parametrize("vocab", [5, 300, 49152])
def test_a_draw_among_the_nonzero_weights_is_the_draw_over_all(vocab: int) -> None:
    """A zero weight adds nothing to the running sum, so the inverse CDF over a
    distribution's nonzero entries alone (a nucleus) gives the token it gives over the
    whole vocabulary, at every uniform, the edges and the largest double below 1
    included."""
    rng = np.random.default_rng(vocab)
    p = np.exp(rng.standard_normal(vocab) * 3.0)
    p[rng.random(vocab) < 0.6] = 0.0
    p[vocab // 3] = 1.0
    p[-1] = 0.0  # a zero at the end: the full draw must not land there
    ids = np.flatnonzero(p)
    for u in [*rng.random(2000), 0.0, 1.0 - 2.0**-53]:
        full = draw(p, float(u))
        assert p[full] > 0 and full == ids[draw(p[ids], float(u))]
    cdf = np.cumsum(p)
    for at in ids[:50]:  # a uniform exactly at a token's upper edge takes the next one
        u = cdf[at] / cdf[-1]
        assert draw(p, float(u)) == ids[draw(p[ids], float(u))]
