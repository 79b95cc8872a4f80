"""`sampling.sample_among`: a draw over a drafter's own vocabulary is `sample`'s draw of the
full row with -inf outside it: the same token at (nearly) every uniform, the repetition
penalty on the ids that are in the subset, greedy its argmax."""

from __future__ import annotations

import numpy as np
import pytest

from engine.sampling import PositionalUniforms, SamplingSettings, sample, sample_among

VOCAB = 3000
SETTINGS = [
    SamplingSettings(temperature=0.7, top_p=0.95, seed=1),
    SamplingSettings(temperature=1.0, top_k=20, min_p=0.02, seed=2),
    SamplingSettings(temperature=0.9, repetition_penalty=1.3, seed=3),
    SamplingSettings(seed=4),  # greedy
    SamplingSettings(repetition_penalty=1.5, seed=5),  # greedy with a penalty
]


@pytest.mark.parametrize(
    "s", SETTINGS, ids=lambda s: f"T{s.temperature}-p{s.top_p}-r{s.repetition_penalty}"
)
def test_a_draw_among_a_subset_is_the_full_rows_draw(s: SamplingSettings) -> None:
    rng = np.random.default_rng(0)
    uniforms = PositionalUniforms(s.seed)
    agree = n = 0
    for trial in range(200):
        ids = np.sort(rng.choice(VOCAB, 500, replace=False))
        row = (rng.standard_normal(500) * 3).astype(np.float32)
        full = np.full(VOCAB, -np.inf)
        full[ids] = row
        # a history holding some of the subset's ids (penalised) and some others
        history = [int(t) for t in rng.choice(VOCAB, 40)] + [int(t) for t in ids[::50]]
        history = history[: 30 + trial % 20]
        got = sample_among(row, ids, history, s, uniforms)
        assert got in set(ids.tolist())
        agree += got == sample(full, history, s, uniforms)
        n += 1
    # the same draw but for the rounding of the normaliser's sum (here: none seen)
    assert agree >= n - 1


def test_the_penalty_falls_on_the_recent_ids_of_the_subset() -> None:
    ids = np.array([10, 20, 30])
    row = np.array([2.0, 1.9, -1.0], dtype=np.float32)
    greedy = SamplingSettings(repetition_penalty=2.0)
    assert sample_among(row, ids, [10], greedy, PositionalUniforms(0)) == 20  # 2.0 -> 1.0
    assert sample_among(row, ids, [11, 99], greedy, PositionalUniforms(0)) == 10
