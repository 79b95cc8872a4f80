"""Prompt lookup's drafts carry a confidence by the length of the match they continue
(engine/match_acceptance.py): each verify's verdict moves the rate at the lengths it
judged, a draft is cut where its expected tokens per second peak, and a free draft that
does not pay at all is dropped, so a fresh question's short matches stop costing verifies
while a regenerate's long one drafts. Output stays plain decoding's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.decoding import DecodeRequest, decode
from engine.draft_costs import AcceptanceModel, CostModel, best_draft_length, cut_draft
from engine.drafters import Draft
from engine.loader import load_model
from engine.match_acceptance import DOUBT, LONGEST, PRIOR_TRIALS, MatchAcceptance, prior_rate
from engine.sampling import SamplingSettings
from engine.sequence import prefill
from engine.suffix_drafter import SuffixDrafter
from tests.conftest import TinyModels
from tests.engine.test_draft_length import cost_model, cpu_nearly_linear, gpu_flat
from tests.tiny_models import EOS_ID, VOCAB_SIZE

# -- the model --------------------------------------------------------------------------


def test_the_prior_rises_with_the_match_and_verdicts_move_only_the_lengths_judged() -> None:
    rates = MatchAcceptance()
    assert rates.rate(2) == pytest.approx(1 / 3) and rates.rate(LONGEST) == prior_rate(LONGEST)
    assert rates.rate(LONGEST + 40) == rates.rate(LONGEST)  # past the longest: the longest's
    before = [rates.rate(n) for n in range(1, LONGEST + 1)]
    # a draft of 5 from a match of 3: tokens at 3 and 4 stood, the one at 5 was rejected,
    # the two after it were never judged
    rates.judge(3, drafted=5, accepted=2)
    after = [rates.rate(n) for n in range(1, LONGEST + 1)]
    assert after[2] > before[2] and after[3] > before[3]  # lengths 3 and 4
    assert after[4] < before[4]  # length 5
    assert after[:2] == before[:2] and after[5:] == before[5:]


def _lower(rates: MatchAcceptance, length: int) -> float:
    """A rate less DOUBT standard deviations of its Beta posterior (not below 0)."""
    at = min(length, LONGEST)
    mean, n = rates.rate(at), rates.trials[at] + PRIOR_TRIALS
    return max(0.0, mean - DOUBT * (mean * (1 - mean) / (n + 1)) ** 0.5)


def test_confidence_is_the_running_product_of_the_rates_along_the_draft() -> None:
    rates = MatchAcceptance()
    for _ in range(30):
        rates.judge(2, drafted=1, accepted=0)
    want = np.cumprod([_lower(rates, 2), _lower(rates, 3), _lower(rates, 4)])
    np.testing.assert_allclose(rates.confidence(2, 3), want, rtol=1e-12)
    rates.judge(16, drafted=3, accepted=2)  # lengths past LONGEST count as it
    assert rates.later < 1.0  # its second token stood, its third did not: below the rates
    lower = [_lower(rates, 15), *[_lower(rates, 16) * rates.later] * 3]
    np.testing.assert_allclose(rates.confidence(15, 4), np.cumprod(lower), rtol=1e-12)
    assert rates.rate(2) < 0.1  # thirty failures outweigh the prior's two verdicts
    assert rates.confidence(5, 0) == []


def test_a_rate_from_few_verdicts_counts_for_less() -> None:
    """A draft's confidence takes each rate a quarter of a deviation below its mean: well
    below it after one verdict, near it after two hundred, never above it."""
    few, many = MatchAcceptance(), MatchAcceptance()
    few.judge(8, drafted=1, accepted=1, verified=False)
    for _ in range(200):
        many.judge(8, drafted=1, accepted=1, verified=False)
    gap_few = few.rate(8) - few.confidence(8, 1)[0]
    gap_many = many.rate(8) - many.confidence(8, 1)[0]
    assert gap_few > 0.03 and 0 <= gap_many < 0.005
    assert MatchAcceptance().confidence(1, 2) == [0.0, 0.0]  # a rate of 0 stays 0


def test_later_tokens_that_fall_lower_later_and_first_misses_leave_it() -> None:
    """`later`: a verified draft's tokens after its first, those that stood over what
    their rates promised. A draft whose first token fell, or a dropped proposal's first
    token, says nothing of them; a new request starts it again; it never raises a rate."""
    rates = MatchAcceptance()
    rates.judge(6, drafted=4, accepted=0)  # the first fell
    rates.judge(6, drafted=1, accepted=0, verified=False)
    assert rates.later == 1.0
    first = rates.confidence(9, 3)[0]
    for _ in range(3):
        rates.judge(9, drafted=4, accepted=1)  # the second fell each time
    assert rates.later < 0.6
    before = rates.confidence(9, 3)
    assert before[1] < _lower(rates, 9) * _lower(rates, 10) * 0.6  # later tokens scaled
    assert before[0] == pytest.approx(_lower(rates, 9)) and before[0] != first  # not the first
    rates.new_request()
    assert rates.later == 1.0 and rates.rate(10) < prior_rate(10)  # the rates stay learned
    for _ in range(20):
        rates.judge(12, drafted=4, accepted=4)
    assert rates.later == 1.0  # capped: more stood than promised


def test_a_chats_verified_drafts_stop_where_the_plain_rates_drafted() -> None:
    """Session 36's H100 case, rebuilt: a fresh chat whose first tokens mostly stood
    (dropped proposals, judged by the token that came) while its verified drafts lost
    their first or second token. On that H100's costs (an 8-row verify 4.9 queued steps)
    a 5-token draft from a match of 14 is dropped; the plain product of the rates (the
    model before session 36) verified 4 of its tokens."""
    h100_ms = {1: 1.402, 2: 2.487, 4: 3.895, 8: 6.162, 16: 12.09}  # bench's calibration
    costs = CostModel(decay=1.0)
    costs.step_seconds = 1.254e-3  # plain decoding's queued step: 797 tok/s
    costs.ratios = {1: 1.0} | {m: ms / 1.254 for m, ms in h100_ms.items() if m > 1}
    rates = MatchAcceptance()
    for i in range(40):
        rates.judge(4 + i % 11, drafted=1, accepted=int(i % 5 != 0), verified=False)
    verified = [(5, 4, 4), (11, 4, 1), (7, 2, 2), (14, 4, 4), (3, 4, 4), (11, 5, 1), (3, 4, 0),
                (4, 4, 0), (5, 4, 0), (7, 2, 0), (13, 5, 0), (14, 6, 3)]  # fmt: skip
    for length, drafted, accepted in verified:
        rates.judge(length, drafted, accepted)
    plain = list(np.cumprod([rates.rate(n) for n in range(14, 19)]))
    assert len(cut_draft(Draft([5, 6, 7, 8, 9], plain, free=True), costs).tokens) == 4
    draft = Draft([5, 6, 7, 8, 9], rates.confidence(14, 5), free=True)
    assert cut_draft(draft, costs).tokens == []


def test_old_verdicts_fade() -> None:
    """A run of failures at a length is outweighed by later successes there."""
    rates = MatchAcceptance()
    for _ in range(40):
        rates.judge(4, drafted=1, accepted=0)
    low = rates.rate(4)
    for _ in range(40):
        rates.judge(4, drafted=1, accepted=1)
    assert low < 0.1 and rates.rate(4) > 0.5


@pytest.mark.parametrize(("drafted", "accepted"), [(1, 2), (1, -1)])
def test_impossible_verdicts_are_refused(drafted: int, accepted: int) -> None:
    with pytest.raises(ValueError, match="accepted"):
        MatchAcceptance().judge(2, drafted, accepted)


def test_a_draft_continues_a_match_of_one_token_at_least() -> None:
    with pytest.raises(ValueError, match="one token at least"):
        MatchAcceptance().rate(0)


# -- the cut ----------------------------------------------------------------------------

DOUBTFUL = [0.3, 0.09, 0.027]


def test_a_free_draft_that_does_not_pay_is_dropped_a_paid_one_keeps_a_row() -> None:
    """A CPU's verify costs ~a step a row: a 30% token does not pay. The block drafter's
    pass was spent, so its draft keeps one row (its verdict is still worth having);
    lookup's cost nothing and goes entirely. On flat (GPU-like) costs both draft."""
    cpu, gpu = cost_model(cpu_nearly_linear), cost_model(gpu_flat)
    assert cut_draft(Draft([7, 8, 9], DOUBTFUL, free=True), cpu).tokens == []
    assert cut_draft(Draft([7, 8, 9], DOUBTFUL), cpu).tokens == [7]
    assert cut_draft(Draft([7], DOUBTFUL[:1], free=True), cpu).tokens == []
    assert cut_draft(Draft([7, 8, 9], DOUBTFUL, free=True), gpu).tokens[:1] == [7]
    sure = cut_draft(Draft([7, 8, 9], [0.99, 0.98, 0.97], free=True), cpu)
    assert sure.tokens == [7, 8, 9] and sure.confidence == [0.99, 0.98, 0.97]


# -- lookup's own rates -------------------------------------------------------------------


def test_lookup_drafts_with_its_rates_and_learns_from_the_verdict() -> None:
    drafter = SuffixDrafter()
    drafter.begin([5, 6, 7, 8, 9, 10, 5, 6])
    draft = drafter.propose(7, 3)  # ... 5 6 7 matched: 8 9 10 follow
    assert draft.tokens == [8, 9, 10] and draft.free
    assert drafter.match_length == 3
    np.testing.assert_allclose(draft.confidence, drafter.match_rates.confidence(3, 3))
    before = drafter.match_rates.rate(4)
    drafter.judge(drafted=3, accepted=1)  # 8 stood (length 3), 9 was rejected (length 4)
    assert drafter.match_rates.rate(4) < before
    assert drafter.match_rates.rate(3) > prior_rate(3)


def test_a_dropped_proposals_first_token_is_judged_by_the_token_that_came() -> None:
    """A proposal no verify judged (its cut dropped it: a plain step instead) gets its
    first token's verdict from the next proposal's pending token, the one that stands
    where the verify would have judged it; not from a token further on, and not twice
    where a verify judged it."""
    context = [5, 6, 7, 8, 9, 10, 5, 6]

    def after(*steps: tuple[list[int], int]) -> tuple[float, float]:
        drafter = SuffixDrafter()
        drafter.begin(context)
        assert drafter.propose(7, 3).tokens == [8, 9, 10]  # from a match of 3
        for committed, pending in steps:
            drafter.commit(committed)
            drafter.propose(pending, 3)
        return float(drafter.match_rates.accepted[3]), float(drafter.match_rates.trials[3])

    assert after(([7], 8)) == (1.0, 1.0)  # 8 came: its first token stood
    assert after(([7], 4)) == (0.0, 1.0)  # 4 came: it would have been rejected
    assert after(([7, 8], 9)) == (0.0, 0.0)  # two tokens on: 9 is no verdict on it
    drafter = SuffixDrafter()
    drafter.begin(context)
    drafter.propose(7, 3)
    drafter.judge(drafted=1, accepted=1)  # verified: the verify's verdict alone
    drafter.commit([7, 8])
    drafter.propose(9, 3)
    assert 0.99 < drafter.match_rates.trials[3] <= 1.0  # one verdict, aged by two tokens


def test_drafts_the_cut_drops_still_teach_their_rates() -> None:
    """Where a verify's rows cost nearly a step each (a CPU's), no draft pays at the
    prior's rates, so the cut drops every one; a reply that repeats itself is what they would
    have drafted, and its plain steps alone (propose, commit, the next token, as a queued
    run decodes) raise the rates until such drafts pay."""
    costs = cost_model(lambda m: 0.01 * (0.05 + 0.95 * m))
    drafter = SuffixDrafter()
    cycle = [3, 4, 5, 6, 7, 8, 9]
    drafter.begin([11, 12, *cycle[:2]])
    reply = [cycle[i % len(cycle)] for i in range(2, 80)]
    pending, kept = reply[0], []
    for token in reply[1:]:
        kept.append(len(cut_draft(drafter.propose(pending, 4), costs).tokens))
        drafter.commit([pending])
        pending = token
    assert not any(kept[:30]) and kept[-1] >= 2  # at the prior, dropped; taught, kept
    assert drafter.match_rates.rate(LONGEST) > 0.99 > prior_rate(LONGEST) + 0.1


# -- the decode loop ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def target(tiny_models: TinyModels) -> Any:
    path = tiny_models.gguf(qtype="F32", seed=0)[0]
    return load_model(path, EngineConfig(backend="numpy")).runner


def greedy(
    target: Any,
    prompt: list[int],
    costs: Any,
    drafter: SuffixDrafter | None = None,
    acceptance: AcceptanceModel | None = None,
    settings: SamplingSettings | None = None,
) -> Any:
    """Greedy decoding (or `settings`') of 40 tokens from `prompt`, with `drafter` if given."""
    state = target.new_state()
    last = np.asarray(target.ops.to_numpy(prefill(target, state, prompt)), np.float64)
    req = DecodeRequest(
        settings=settings or SamplingSettings(),
        max_tokens=40,
        eos_ids=frozenset({EOS_ID}),
        emit=lambda _ids, _flags: None,
        should_stop=lambda: False,
        drafter=drafter,
        acceptance=acceptance or (AcceptanceModel() if drafter is not None else None),
    )
    return decode(target, state, last, req, costs)


def decode_plain(target: Any, prompt: list[int]) -> list[int]:
    return list(greedy(target, prompt, cost_model(gpu_flat)).token_ids)


def decoded(target: Any, prompt: list[int], drafter: SuffixDrafter, costs: Any) -> Any:
    """Decoding with lookup, and the match length of every draft that reached a verify."""
    judged: list[int] = []
    judge = drafter.judge
    drafter.judge = lambda d, a: (judged.append(drafter.match_length), judge(d, a))[1]  # type: ignore[method-assign]
    return greedy(target, prompt, costs, drafter), judged


def test_short_matches_that_failed_stop_costing_verifies_a_long_one_drafts(target: Any) -> None:
    """Lookup's rates say matches under 12 tokens fail and longer ones stand. A reply
    retracing an earlier one (its whole prompt matched) drafts and keeps it; a fresh
    prompt whose matches are short verifies none of them. Both reply as plain does."""
    rng = np.random.default_rng(3)
    prompt = [int(t) for t in rng.integers(3, VOCAB_SIZE, 14)]
    fresh = [*prompt[:6], *(int(t) for t in rng.integers(3, VOCAB_SIZE, 8))]
    costs = cost_model(gpu_flat)
    plain = {tuple(p): decode_plain(target, p) for p in (prompt, fresh)}

    def primed(taught: bool) -> SuffixDrafter:
        drafter = SuffixDrafter()
        for length in range(1, LONGEST + 1) if taught else ():
            for _ in range(60):  # the rates, as many verdicts had taught them
                drafter.match_rates.judge(length, 1, 1 if length >= 12 else 0)
        drafter.begin(prompt)
        drafter.commit(plain[tuple(prompt)])  # the earlier reply to the same prompt
        drafter.end()
        return drafter

    drafter = primed(taught=True)
    result, judged = decoded(target, prompt, drafter, costs)
    assert result.token_ids == plain[tuple(prompt)]
    assert result.accepted >= len(result.token_ids) // 2 and min(judged) >= 12

    result, judged = decoded(target, fresh, drafter, costs)
    assert result.token_ids == plain[tuple(fresh)]
    assert all(n >= 12 for n in judged)
    # at the prior's rates, the same fresh prompt verified drafts from short matches
    result, judged = decoded(target, fresh, primed(taught=False), costs)
    assert result.token_ids == plain[tuple(fresh)]
    assert judged and min(judged) < 12


def test_a_length_whose_drafts_stopped_paying_is_tried_again_after_some_decoding() -> None:
    """Two misses at the longest match (where a regenerate leaves the earlier reply) must
    not end drafting from it for good, though no proposal from it comes to be judged.
    Decoded tokens age the evidence back toward the prior; without them nothing moves."""
    drafter = SuffixDrafter()
    drafter.begin([1, 2, 3])
    for _ in range(3):
        drafter.match_rates.judge(LONGEST, drafted=1, accepted=0)
    low = drafter.match_rates.rate(LONGEST)
    assert low < 0.5 and drafter.match_rates.rate(LONGEST) == low  # reading ages nothing
    for token in range(800):
        drafter.commit([4 + token % 50])
    assert drafter.match_rates.rate(LONGEST) > 0.7 > low


def test_lookup_is_asked_every_round_whatever_its_request_wide_rate(target: Any) -> None:
    """Lookup's match says how good its draft is, so the loop asks it every round for the
    most rows and its cut decides. Gated by one rate a request (0.5 at its start), a draft
    of one token barely paid at a GPU's costs, and a regenerate drafted nothing on an H100
    (session 28); here the rate says its drafts all fail, and the regenerate still drafts."""
    rng = np.random.default_rng(5)
    prompt = [int(t) for t in rng.integers(3, VOCAB_SIZE, 12)]
    reply = decode_plain(target, prompt)
    drafter = SuffixDrafter()
    drafter.begin(prompt)
    drafter.commit(reply)
    drafter.end()
    hopeless = AcceptanceModel()
    for _ in range(30):
        hopeless.observe(drafted=4, accepted=0)
    # a GPU's queued step against a verify that stops the queue (session 27's H100: 0.72
    # ms, 1.03 for 2 rows): a k the rate alone chooses is 0
    costs = cost_model(lambda m: 0.01 * (1 + 0.4 * min(m - 1, 1) + 0.03 * m))
    assert best_draft_length(hopeless.rate, costs, 16) == 0
    hopeless.forget = lambda: None  # type: ignore[method-assign]  # keep it hopeless
    result = greedy(target, prompt, costs, drafter, hopeless)
    assert result.token_ids == reply
    assert result.accepted >= len(reply) // 2


def test_a_pool_ranks_lookup_at_its_most_rows_whatever_its_rate() -> None:
    """In a pool too, lookup's k is the room (its cut decides), however low its rate."""
    from engine.drafter_pool import DrafterPool, Member

    hopeless = AcceptanceModel()
    for _ in range(30):
        hopeless.observe(drafted=4, accepted=0)
    pool = DrafterPool([Member("lookup", SuffixDrafter(), hopeless)])
    costs = cost_model(lambda m: 0.01 * (1 + 0.4 * min(m - 1, 1) + 0.03 * m))
    assert best_draft_length(hopeless.rate, costs, 10) == 0
    assert pool.choose_k(costs, 10) == 10 and pool.round_is_free


def test_sampled_requests_keep_their_own_match_rates(target: Any) -> None:
    """A sampled request's drafts stand with the target's draw, far less often at a long
    match than a greedy one's (open chat: 24% against 96%): its verdicts go to the sampled
    rates and leave the greedy ones as they were, and the next greedy request reads those."""
    rng = np.random.default_rng(7)
    prompt = [int(t) for t in rng.integers(3, VOCAB_SIZE, 12)]
    drafter = SuffixDrafter()
    drafter.begin(prompt)
    drafter.commit(decode_plain(target, prompt))  # an earlier greedy reply to match
    drafter.end()
    greedy_before = [drafter.match_rates.rate(n) for n in range(1, LONGEST + 1)]
    sampled = SamplingSettings(temperature=0.2, seed=3)
    result = greedy(target, prompt, cost_model(gpu_flat), drafter, settings=sampled)
    assert result.drafted > 0  # verdicts were given
    drafter.couple(lambda _row, _history: 0)  # a sampled request's rates: moved
    assert [drafter.match_rates.rate(n) for n in range(1, LONGEST + 1)] != greedy_before
    drafter.begin(prompt)  # a greedy request's: as before
    assert [drafter.match_rates.rate(n) for n in range(1, LONGEST + 1)] == greedy_before
