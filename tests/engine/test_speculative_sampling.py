"""Coupled sampling (engine/decoding.py): a verify draws at each row the token plain
decoding draws there and accepts a draft iff it equals it, so the emitted tokens follow
exactly the target's distribution. Checked by chi-square tests over many seeded runs of
decode() with drafting on, on full-attention and hybrid models, and on the verify alone;
the per-position uniforms are uniform and independent of how the loop got there.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import decoding, verify_rows
from engine.config import EngineConfig
from engine.decoding import DecodeRequest, decode
from engine.draft_costs import AcceptanceModel, CostModel
from engine.drafters import Draft
from engine.loader import load_model
from engine.sampling import PositionalUniforms, SamplingSettings, probabilities, sample
from engine.sequence import prefill, truncate
from tests.conftest import TinyModels
from tests.hybrid_models import make_hybrid_dir

GREEDY = SamplingSettings()
SMALL_VOCAB = 8
TRANSFORMS = {
    "plain": SamplingSettings(temperature=1.0),
    "temperature": SamplingSettings(temperature=0.6),
    "top_k": SamplingSettings(temperature=1.2, top_k=5),
    "top_p": SamplingSettings(temperature=0.9, top_p=0.8),
    "min_p_penalty": SamplingSettings(temperature=1.0, min_p=0.05, repetition_penalty=1.5),
}

# -- chi-square ---------------------------------------------------------------------------


def chi_square_sf(stat: float, df: int) -> float:
    """P(X > stat) for X ~ chi-square(df): the regularized upper gamma Q(df/2, stat/2) in
    closed form (integer and half-integer shapes; Abramowitz & Stegun 6.5.13, 26.4.4)."""
    y = stat / 2
    if df % 2 == 0:
        return math.exp(-y) * sum(y**i / math.factorial(i) for i in range(df // 2))
    tail = sum(y ** (i - 0.5) / math.gamma(i + 0.5) for i in range(1, (df - 1) // 2 + 1))
    return math.erfc(math.sqrt(y)) + math.exp(-y) * tail


def p_value(counts: np.ndarray, p: np.ndarray) -> float:
    """Pearson's chi-square goodness of fit of `counts` to `p`; tokens p rules out must
    never appear (they are excluded from the statistic)."""
    support = p > 0
    assert counts[~support].sum() == 0, f"drew tokens the target rules out: {counts}"
    expected = counts.sum() * p[support]
    stat = float(np.sum((counts[support] - expected) ** 2 / expected))
    return chi_square_sf(stat, int(support.sum()) - 1)


def test_chi_square_sf_matches_known_values() -> None:
    # (stat, df, upper tail) from standard tables
    for stat, df, want in [(3.841, 1, 0.05), (5.991, 2, 0.05), (11.070, 5, 0.05), (9.488, 4, 0.05)]:
        assert chi_square_sf(stat, df) == pytest.approx(want, abs=2e-4)


# -- the per-position uniforms ------------------------------------------------------------


def test_positional_uniforms_depend_on_seed_and_position_only() -> None:
    a, b = PositionalUniforms(7), PositionalUniforms(7)
    positions = [5, 0, 900, 5, 3]
    assert [a.uniform(p) for p in positions] == [b.uniform(p) for p in reversed(positions)][::-1]
    assert a.uniform(1) != a.uniform(2)
    assert PositionalUniforms(8).uniform(1) != a.uniform(1)
    assert PositionalUniforms(None).uniform(1) != PositionalUniforms(None).uniform(1)
    values = np.array([a.uniform(p) for p in range(5000)])
    # the kept uniforms (the last few positions asked for) are the ones computed afresh
    fresh = PositionalUniforms(7)
    again = (4999, 3, 4995, 2)
    assert [a.uniform(p) for p in again] == [fresh.uniform(p) for p in again]
    assert len(a._kept) <= PositionalUniforms.KEPT
    assert np.all((values >= 0) & (values < 1))
    counts = np.histogram(values, bins=10, range=(0, 1))[0]
    assert p_value(counts, np.full(10, 0.1)) > 1e-3
    with pytest.raises(ValueError):
        SamplingSettings(temperature=1.0, seed=-1)


# -- the verify alone ---------------------------------------------------------------------


@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_verify_draws_what_plain_sampling_draws(transform: str) -> None:
    """Each row's token is plain decoding's at that position; a draft stands iff it equals
    it, so the accepted prefix and the next token are exactly plain decoding's."""
    s = TRANSFORMS[transform]
    rng = np.random.default_rng(5)
    for seed in range(300):
        uniforms = PositionalUniforms(seed)
        logits = rng.standard_normal((4, SMALL_VOCAB)) * 1.5
        context = [int(t) for t in rng.integers(0, SMALL_VOCAB, 4)]
        plain = []  # plain decoding from the same rows
        for i in range(4):
            plain.append(sample(logits[i], context + plain, s, uniforms))
        num_right = int(rng.integers(0, 4))  # drafts agreeing with plain decoding first
        drafts = plain[:num_right] + [int(t) for t in rng.integers(0, SMALL_VOCAB, 3 - num_right)]
        history = [*context[:-1], context[-1], *drafts]  # context's last token is pending
        accepted, nxt = verify_rows.verify(logits, Draft(drafts), 3, history, s, uniforms)
        want = next((i for i in range(3) if drafts[i] != plain[i]), 3)
        assert (accepted, nxt) == (want, plain[want])


def test_greedy_verify_accepts_the_argmax_prefix() -> None:
    logits = np.zeros((4, SMALL_VOCAB))
    logits[[0, 1, 2, 3], [2, 5, 1, 7]] = 1.0
    uniforms = PositionalUniforms(0)
    history = [0, 0, 2, 5, 3]  # context [0], pending 0, drafts 2, 5, 3
    assert verify_rows.verify(logits, Draft([2, 5, 3]), 3, history, GREEDY, uniforms) == (2, 1)
    history = [0, 0, 2, 5, 1]
    assert verify_rows.verify(logits, Draft([2, 5, 1]), 3, history, GREEDY, uniforms) == (3, 7)


# -- through decode(), drafting on ----------------------------------------------------------

NUM_RUNS = 4000
PROMPT = [5, 9, 14, 2, 77, 31]
DECODE_TRANSFORMS = {  # top-k keeps the support small enough for 4000 runs
    "llama": [
        SamplingSettings(temperature=1.0, top_k=5),
        SamplingSettings(temperature=0.7, top_k=8, top_p=0.8, min_p=0.05, repetition_penalty=1.3),
    ],
    "hybrid": [SamplingSettings(temperature=1.2, top_k=6, repetition_penalty=1.2)],
}


class FixedDrafter:
    """Always proposes the same two tokens, whatever the context (deterministic)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def begin(self, context: list[int]) -> None:
        pass

    def propose(self, pending: int, k: int) -> Draft:
        return Draft(self.tokens[:k])

    def commit(self, tokens: list[int]) -> None:
        pass

    def end(self) -> None:
        pass


def target_p(model: Any, tokens: list[int], s: SamplingSettings) -> np.ndarray:
    """The target's distribution after `tokens`, from a fresh prefill."""
    logits = prefill(model, model.new_state(), tokens)
    row = np.asarray(model.ops.to_numpy(logits), dtype=np.float64).reshape(-1)
    return probabilities(row, tokens, s)


def next_counts(
    outputs: Counter[tuple[int, ...]], prefix: tuple[int, ...], vocab: int
) -> np.ndarray:
    """How often each token followed `prefix` in the outputs."""
    counts = np.zeros(vocab, dtype=np.int64)
    for out, n in outputs.items():
        if out[: len(prefix)] == prefix:
            counts[out[len(prefix)]] += n
    return counts


@pytest.mark.parametrize("family", ["llama", "hybrid"])
def test_decode_with_drafts_keeps_the_target_distribution(
    family: str,
    tiny_models: TinyModels,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three tokens per run, seeds 0..3999, every step verifying two drafted tokens: the
    likeliest continuation of the likeliest start, so both accepts and rejections are
    common. The second token (row 0 of the verify) given the likeliest first, and the
    third given each frequent prefix (accepted draft or the target's own token), follow
    the target's distribution."""
    if family == "llama":
        path = tiny_models.gguf(qtype="F32")[0]
    else:
        path = tmp_path / "hybrid"
        make_hybrid_dir(path)
    model = load_model(path, EngineConfig(backend="numpy")).runner
    monkeypatch.setattr(decoding, "best_draft_length", lambda _a, _c, room, *_: min(room, 2))
    for s in DECODE_TRANSFORMS[family]:
        p0 = target_p(model, PROMPT, s)
        first = int(np.argmax(p0))
        p1 = target_p(model, [*PROMPT, first], s)
        drafts = [int(np.argmax(p1))]
        drafts.append(int(np.argmax(target_p(model, [*PROMPT, first, drafts[0]], s))))
        state = model.new_state()
        state.mark(len(PROMPT))  # a hybrid truncates back to the prompt from this snapshot
        last = np.asarray(model.ops.to_numpy(prefill(model, state, PROMPT)), dtype=np.float64)
        outputs: Counter[tuple[int, ...]] = Counter()
        num_accepted = num_drafted = 0
        for seed in range(NUM_RUNS):
            req = DecodeRequest(
                settings=SamplingSettings(**{**s.__dict__, "seed": seed}),
                max_tokens=3,
                eos_ids=frozenset(),
                emit=lambda _ids, _flags: None,
                should_stop=lambda: False,
                drafter=FixedDrafter(drafts),
                acceptance=AcceptanceModel(),
            )
            result = decode(model, state, last.reshape(-1), req, CostModel())
            outputs[tuple(result.token_ids)] += 1
            num_drafted += result.drafted
            num_accepted += result.accepted
            truncate(model, state, len(PROMPT))
        assert 0 < num_accepted < num_drafted
        assert p_value(next_counts(outputs, (), p0.size), p0) > 1e-3
        assert p_value(next_counts(outputs, (first,), p0.size), p1) > 1e-3
        tested = 0
        for prefix in {out[:2] for out in outputs}:
            c = next_counts(outputs, prefix, p0.size)
            if c.sum() >= 200:
                assert p_value(c, target_p(model, [*PROMPT, *prefix], s)) > 1e-3, prefix
                tested += 1
        assert tested >= 1
