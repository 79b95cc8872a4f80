"""The draft length follows measured cost and acceptance: k maximises expected tokens per
second (0 always a candidate), the cost model tracks the machine, and the acceptance model
forgets old evidence.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from engine.draft_costs import (
    MAX_DRAFT,
    AcceptanceModel,
    CostModel,
    best_draft_length,
    cut_draft,
    expected_tokens,
)
from engine.drafters import Draft

# -- the draft length: expected tokens per second ----------------------------------------


def cost_model(seconds: Callable[[int], float]) -> CostModel:
    """Costs measured once for 1..17 rows; decay 1 keeps them (decode's timings are ignored)."""
    costs = CostModel(decay=1.0)
    for m in range(1, MAX_DRAFT + 2):
        costs.observe(m, seconds(m))
    return costs


def cpu_linear(m: int) -> float:  # MLX's CPU backend: a verify of m rows ~ m decode steps
    return 0.01 * m


def cpu_nearly_linear(m: int) -> float:  # plus a little fixed cost per step
    return 0.01 * (m + 0.25)


def gpu_flat(m: int) -> float:  # launch-bound: extra rows nearly free
    return 0.01 * (1 + 0.03 * m)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.6, 0.9, 0.99, 1.0])
def test_linear_cost_never_speculates(alpha: float) -> None:
    assert best_draft_length(alpha, cost_model(cpu_linear), 16) == 0


def test_nearly_linear_cost_speculates_only_at_very_high_acceptance() -> None:
    costs = cost_model(cpu_nearly_linear)
    assert [best_draft_length(a, costs, 16) for a in (0.0, 0.3, 0.6, 0.8)] == [0, 0, 0, 0]
    assert best_draft_length(0.98, costs, 16) > 0


def test_flat_cost_speculates_long_drafts() -> None:
    costs = cost_model(gpu_flat)
    ks = [best_draft_length(a, costs, 16) for a in (0.3, 0.6, 0.8, 0.9, 0.95)]
    assert ks == sorted(ks)  # more acceptance, longer drafts
    assert ks[0] >= 1 and ks[2] >= 4 and ks[-1] >= 8


@pytest.mark.parametrize("seconds", [cpu_linear, cpu_nearly_linear, gpu_flat, None])
def test_no_acceptance_never_speculates(seconds: Callable[[int], float] | None) -> None:
    costs = CostModel() if seconds is None else cost_model(seconds)
    for alpha in (0.0, 0.005):
        assert best_draft_length(alpha, costs, 16) == 0
    assert best_draft_length(0.0, cost_model(lambda m: 1.0), 16) == 0  # perfectly flat


def test_draft_length_respects_the_room_left() -> None:
    costs = cost_model(gpu_flat)
    assert best_draft_length(0.95, costs, 0) == 0
    assert best_draft_length(0.95, costs, 3) == 3


def test_unmeasured_cost_is_assumed_linear() -> None:
    assert best_draft_length(0.9, CostModel(), 16) == 0


def test_cost_model_interpolates_and_extrapolates() -> None:
    costs = CostModel(decay=1.0)
    assert [costs.cost(m) for m in (1, 2, 5)] == [1.0, 2.0, 5.0]  # unmeasured: linear
    costs.observe(1, 0.010)
    costs.observe(4, 0.016)
    assert costs.cost(4) == pytest.approx(0.016)
    assert costs.cost(2) == pytest.approx(0.012)  # between measured points
    assert costs.cost(8) == pytest.approx(0.032)  # past the top: linear in the extra rows


def test_cost_model_follows_the_machine_after_a_burst_of_load() -> None:
    """Calibrated while the machine was busy; once plain steps are fast again, a verify is
    judged by its ratio to a plain step, so speculation is still worth it."""
    costs = CostModel()
    for rows, seconds in [(1, 0.040), (2, 0.050), (4, 0.060), (8, 0.090)]:
        costs.observe(rows, seconds)
    for _ in range(30):  # plain decoding after the burst
        costs.observe(1, 0.015)
    assert costs.cost(4) == pytest.approx(0.015 * 1.5, rel=0.01)
    assert best_draft_length(0.9, costs, 16) >= 3


def test_acceptance_model_estimates_the_per_token_rate() -> None:
    rng = np.random.default_rng(0)
    for alpha in (0.3, 0.7, 0.9):
        model = AcceptanceModel(decay=0.998)
        for _ in range(2000):
            accepted = 0
            while accepted < 4 and rng.random() < alpha:  # geometric, capped at k = 4
                accepted += 1
            model.observe(drafted=4, accepted=accepted)
        assert model.rate == pytest.approx(alpha, abs=0.05)


def test_acceptance_model_follows_a_change_of_regime() -> None:
    model = AcceptanceModel()
    assert model.rate == 0.5  # the prior
    for _ in range(30):
        model.observe(drafted=8, accepted=8)
    assert model.rate > 0.9
    num_failures = 0
    while model.rate >= 0.5:  # a regenerate's copied text ends: drafts start failing
        model.observe(drafted=8, accepted=0)
        num_failures += 1
    assert num_failures <= 10


def test_acceptance_recovers_without_drafts() -> None:
    """A rate below break-even is tested again later in the request (evidence ages on plain
    steps) and at once in the next request (a regenerate must not inherit a fresh chat's)."""
    costs = cost_model(cpu_nearly_linear)
    model = AcceptanceModel()
    for _ in range(5):
        model.observe(drafted=4, accepted=0)
    assert best_draft_length(model.rate, costs, 16) == 0
    for _ in range(300):
        model.idle()
    assert model.rate == pytest.approx(0.5, abs=0.01)
    model.observe(drafted=4, accepted=0)
    model.forget()
    assert model.rate == 0.5


# -- cutting a draft by its drafter's confidence -----------------------------------------

SURE = [0.9, 0.8, 0.5, 0.1, 0.02, 0.01]  # P(rows 1..j all accepted), the drafter's estimate


def by_hand(confidence: list[float], costs: CostModel, queued: bool = False) -> int:
    """The k in 1..len with the most (1 + P_1 + ... + P_k) / cost(k + 1), worked out here;
    behind a queued step, per cost(1) + cost(k)."""
    rates = [
        (1 + sum(confidence[:k])) / price(costs, k, queued) for k in range(1, len(confidence) + 1)
    ]
    return 1 + int(np.argmax(rates))


def price(costs: CostModel, k: int, queued: bool) -> float:
    """What verifying k drafted tokens costs: a pass of k + 1 rows, or where a step queued on
    the pending token gives the first row, that step and a pass of the k drafts."""
    return costs.cost(1) + costs.cost(k) if queued else costs.cost(k + 1)


@pytest.mark.parametrize(
    ("seconds", "keep"), [(gpu_flat, 4), (cpu_nearly_linear, 1), (lambda m: 0.01 + 0.002 * m, 3)]
)
def test_a_draft_is_cut_where_its_expected_tokens_per_second_peak(
    seconds: Callable[[int], float], keep: int
) -> None:
    """Flat verify costs keep the confident rows and a few more; a CPU's costs keep one
    row (never none: the pass is paid); the tokens and confidences kept are the first ones."""
    costs = cost_model(seconds)
    draft = cut_draft(Draft([11, 12, 13, 14, 15, 16], SURE), costs)
    assert len(draft.tokens) == keep == by_hand(SURE, costs)
    assert draft.tokens == [11, 12, 13, 14, 15, 16][:keep]
    assert draft.confidence == SURE[:keep]


def test_a_draft_behind_a_queued_step_pays_for_that_step() -> None:
    """On a GPU's costs (a queued step 0.72 ms, verifies of 2 / 4 / 8 rows 1.16 / 1.46 /
    1.92 ms: the H100's, session 45) a free draft of four tokens lookup is fair about keeps
    three where its pass takes the pending token's row too, and none where the step queued
    on that token gives the row: that step and a pass of three rows cost 2.8 plain steps,
    which the draft's 2.45 expected tokens do not beat. A sure draft stays whole."""
    ms = {1: 0.72, 2: 1.16, 4: 1.46, 8: 1.92, 16: 3.04}
    costs = CostModel()
    costs.step_seconds, costs.ratios = ms[1] / 1e3, {m: t / ms[1] for m, t in ms.items()}
    fair = Draft([5, 6, 7, 8], [0.7, 0.45, 0.3, 0.15], free=True)
    assert cut_draft(fair, costs).tokens == [5, 6, 7]
    assert cut_draft(fair, costs, queued=True).tokens == []
    sure = Draft([5, 6, 7, 8], [0.99, 0.98, 0.97, 0.96], free=True)
    assert cut_draft(sure, costs, queued=True).tokens == [5, 6, 7, 8]


def test_a_draft_without_confidence_is_left_whole() -> None:
    """Draft models give no confidence: the cost model's k stands."""
    costs = cost_model(cpu_nearly_linear)
    assert cut_draft(Draft([1, 2, 3]), costs).tokens == [1, 2, 3]
    assert cut_draft(Draft([1]), costs).tokens == [1]
    assert cut_draft(Draft([]), costs).tokens == []


def _best_by_definition(alpha: float, costs: CostModel, available: int, token_s: float) -> int:
    """best_draft_length as its docstring states it, each term computed afresh."""
    best_k, best_rate = 0, 1.0 / costs.cost(1)
    for k in range(1, min(available, MAX_DRAFT) + 1):
        tokens = sum(alpha**i for i in range(k + 1))
        rate = tokens / (costs.cost(k + 1) + k * token_s)
        if rate > best_rate * 1.02:
            best_k, best_rate = k, rate
    return best_k


def test_the_cost_table_follows_every_change_of_the_costs() -> None:
    """The per-step choice reads a table of costs made once per change: observed steps and
    verifies, a charge, and ratios or a step cost set from outside all remake it, and the
    choice is the definition's over random acceptances and curves."""
    rng = np.random.default_rng(7)
    costs = CostModel()
    costs.observe(1, 0.01)
    for _ in range(200):
        change = rng.integers(4)
        if change == 0:
            costs.observe(int(rng.choice([1, 2, 4, 8, 16])), float(rng.uniform(0.005, 0.05)))
        elif change == 1:
            costs.charge(int(rng.choice([2, 4, 8])), float(rng.uniform(0, 0.01)))
        elif change == 2:
            costs.ratios[int(rng.choice([2, 4, 8, 16]))] = float(rng.uniform(1.0, 8.0))
        else:
            costs.step_seconds = float(rng.uniform(0.005, 0.02))
        assert costs.table()[1:] == [costs.cost(m) for m in range(1, MAX_DRAFT + 2)]
        alpha, token_s = float(rng.uniform(0, 1)), float(rng.choice([0.0, 0.001]))
        available = int(rng.integers(0, 20))
        assert best_draft_length(alpha, costs, available, token_s) == _best_by_definition(
            alpha, costs, available, token_s
        )


def test_the_cut_is_its_definition_on_random_drafts_and_costs() -> None:
    """cut_draft, in plain floats over the cost table, keeps by_hand's k (NumPy, each cost
    asked afresh) on random confidences and costs; a free draft none where that k's rate
    is within the margin of a plain step's."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        bends = rng.uniform(0.0, 0.5, 3)
        costs = cost_model(lambda m, b=bends: 0.01 * (1 + b[0] * (m - 1) + b[1] * (m - 1) ** b[2]))
        n = int(rng.integers(1, MAX_DRAFT + 1))
        confidence = [float(p) for p in np.cumprod(rng.uniform(0.05, 1.0, n))]
        free, queued = bool(rng.integers(2)), bool(rng.integers(2))
        kept = cut_draft(Draft(list(range(n)), confidence, free=free), costs, queued)
        keep = by_hand(confidence, costs, queued) if n > 1 or free else n
        rate = (1 + sum(confidence[:keep])) / price(costs, keep, queued)
        if free and rate <= 1.02 / costs.cost(1):
            keep = 0
        assert kept.tokens == list(range(keep)) and kept.confidence == confidence[:keep]


def test_expected_tokens_is_the_sum_of_the_accept_chances() -> None:
    """The closed form the pool ranks with each step is 1 + a + ... + a^k (a = 1: k + 1)."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        alpha, k = float(rng.uniform(0, 1)), int(rng.integers(0, 17))
        assert expected_tokens(alpha, k) == pytest.approx(sum(alpha**i for i in range(k + 1)))
    assert expected_tokens(1.0, 5) == 6.0 and expected_tokens(0.0, 5) == 1.0
