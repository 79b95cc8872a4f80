"""A free draft proposed on a queued step's token throws that step away: plain decoding
would have kept its token, and the verify recomputes its row. The cut prices the verify
one step dearer there (`cut_draft(..., discarded=)`), and the round verifies the draft as
cut where it was proposed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from engine import decoding
from engine.draft_costs import MARGIN, CostModel, cut_draft
from engine.drafters import Draft
from tests.engine.test_launch_ahead import PROMPT, SometimesDrafter, _decode, _synchronous
from tests.engine.test_launch_ahead import runner as runner  # the fixture: every layer kind

# Session 37's H100, the Llama 3.2 1B shape: the bench's calibration in ms, and plain
# decoding's queued step (832 tok/s); docs/h100/speculative-llama-3.2-1b-20261206-s37.json
H100_1B_MS = {2: 2.283, 4: 3.368, 8: 5.503, 16: 11.41}
QUEUED_STEP_S = 1 / 832


def h100_1b() -> CostModel:
    costs = CostModel(decay=1.0)
    costs.step_seconds = QUEUED_STEP_S
    costs.ratios = {1: 1.0} | {m: ms / 1e3 / QUEUED_STEP_S for m, ms in H100_1B_MS.items()}
    return costs


def test_a_draft_that_pays_alone_loses_to_the_queued_step_it_throws_away() -> None:
    """Four tokens at 90/80/70/60% (4.0 expected tokens) in a 5-row verify (3.90 ms) beat
    plain decoding's 3.25 tokens in that time; with the queued step's token kept by plain
    decoding (4.25 tokens in that time, + 1) they lose, and the draft is dropped. A draft
    of a repeated answer (12 tokens at 99% each) still pays."""
    costs = h100_1b()
    likely = Draft([5, 6, 7, 8], [0.9, 0.8, 0.7, 0.6], free=True)
    assert cut_draft(likely, costs).tokens == [5, 6, 7, 8]
    assert cut_draft(likely, costs, discarded=costs.cost(1)).tokens == []
    sure = Draft(list(range(12)), list(np.cumprod([0.99] * 12)), free=True)
    assert cut_draft(sure, costs, discarded=costs.cost(1)).tokens == list(range(12))


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_the_priced_cut_keeps_a_draft_where_its_accepted_tokens_outnumber_the_verifys_steps(
    k: int,
) -> None:
    """Plain decoding's alternative over the verify's time is 1 + cost(k + 1) / cost(1)
    tokens; the verify's 1 + accepted. Sure drafts of k tokens are kept exactly where k beats
    cost(k + 1) / cost(1) by the margin, whatever the queued step's share of it."""
    costs = h100_1b()
    steps = costs.cost(k + 1) / costs.cost(1)  # 1.90, 2.80, 4.58, 9.17 on this shape
    sure = Draft(list(range(k)), [1.0] * k, free=True)
    kept = cut_draft(sure, costs, discarded=costs.cost(1)).tokens
    pays = (1 + k) / (steps + 1) > MARGIN
    assert kept == (list(range(k)) if pays else [])
    assert pays == (k > 2)


def test_a_draft_proposed_on_a_queued_steps_token_is_verified_as_its_priced_cut(
    runner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut after a queued step is asked with that step's cost, and the round verifies
    that cut: not the draft cut again without it. Here the priced cut keeps one token and
    the unpriced two, so a verify of 2 rows follows each undone queued step and one of 3
    rows every draft the loop asked for itself. The reply stays plain greedy."""
    plain = _synchronous(runner, monkeypatch, max_tokens=40)[0].token_ids
    priced: list[int] = []  # the tokens of each draft cut with the queued step's price
    verifies: list[int] = []
    observe = CostModel.observe

    def cut(draft: Draft, costs: CostModel, discarded: float = 0.0) -> Draft:
        if discarded:
            assert discarded == costs.cost(1)
            priced.append(len(draft.tokens))
        return replace(draft, tokens=draft.tokens[: 1 if discarded else 2])

    def observing(self: CostModel, rows: int, seconds: float) -> None:
        if rows > 1:
            verifies.append(rows)
        observe(self, rows, seconds)

    monkeypatch.setattr(decoding, "cut_draft", cut)
    monkeypatch.setattr(CostModel, "observe", observing)
    monkeypatch.setattr(
        decoding, "_choose_k", lambda req, costs, produced, *_: 3 * (produced % 9 in (4, 5, 6, 7))
    )
    got = _decode(runner, max_tokens=40, drafter=SometimesDrafter(PROMPT + plain, 0.5, 1))[0]
    monkeypatch.undo()
    assert got.token_ids == plain
    assert verifies.count(2) == sum(n > 0 for n in priced) >= 3
    assert set(verifies) <= {2, 3}
