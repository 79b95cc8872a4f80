"""Where a reply and a draft must stop (issue 16 point 11): the draft length stays within
what a sliding ring can take back, a reply cut by the context says so (CONTEXT_FULL, not
the max-tokens LENGTH), fitting the context leaves the reply room, and the cost a verify
is weighed by includes putting the state right after it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from engine import decoding
from engine import events as ev
from engine.config import EngineConfig
from engine.decoding import DecodeRequest, DecodeResult, decode
from engine.draft_costs import AcceptanceModel, CostModel
from engine.drafters import Drafter
from engine.loader import load_model
from engine.sampling import SamplingSettings
from engine.sequence import SequenceState, prefill
from engine.state import SnapshotPolicy
from tests.conftest import TinyModels
from tests.engine.engine_runner import Runner, assert_same_reply, fresh_finished, prompt_ids, user
from tests.engine.test_speculative import ScriptedDrafter, assert_exact, assert_holds_output
from tests.tiny_models import EOS_ID

GREEDY = SamplingSettings()
WINDOW, SLACK = 8, 2


def decode_from(
    model: Any,
    state: SequenceState,
    prompt: list[int],
    max_tokens: int,
    drafter: Drafter | None = None,
    costs: CostModel | None = None,
    context_limit: int = 1 << 30,
) -> DecodeResult:
    last = np.asarray(model.ops.to_numpy(prefill(model, state, prompt)), dtype=np.float64)
    req = DecodeRequest(
        settings=GREEDY,
        max_tokens=max_tokens,
        eos_ids=frozenset({EOS_ID}),
        emit=lambda _ids, _flags: None,
        should_stop=lambda: False,
        drafter=drafter,
        acceptance=AcceptanceModel() if drafter is not None else None,
        context_limit=context_limit,
    )
    return decode(model, state, last.reshape(-1), req, costs or CostModel())


@pytest.fixture
def longest_drafts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step drafts as many tokens as decode allows (whatever the costs say)."""
    monkeypatch.setattr(decoding, "best_draft_length", lambda _a, _c, room, *_: room)


# -- the draft length and a sliding ring ------------------------------------------------------


@pytest.mark.usefixtures("longest_drafts")
def test_drafts_stay_within_what_a_sliding_ring_can_take_back(tiny_models: TinyModels) -> None:
    """A ring of window + 2 rows takes back at most 3 rows once it has wrapped: a verify of
    more rows could not be trimmed after a rejection (before: StateError mid-reply)."""
    path = tiny_models.hf("llama", sliding_window=WINDOW)[0]
    model = load_model(path, EngineConfig(backend="numpy")).runner
    policy = SnapshotPolicy(sliding_slack=SLACK)
    prompt = [int(t) for t in np.random.default_rng(3).integers(3, 200, 20)]  # the ring wraps
    plain = decode_from(model, model.new_state(policy), prompt, 30)
    rows_seen: list[int] = []
    forward = model.forward

    def counting(token_ids: list[int], state: SequenceState, logits: str = "last") -> Any:
        rows_seen.append(len(token_ids))
        return forward(token_ids, state, logits)

    model.forward = counting  # type: ignore[method-assign]
    eos = [EOS_ID] if plain.reason == "eos" else []
    drafter = ScriptedDrafter([*prompt, *plain.token_ids, *eos], corrupt=0.3, seed=1)
    state = model.new_state(policy)
    result = decode_from(model, state, prompt, 30, drafter)
    assert state.max_verify_rows() == SLACK + 2
    assert (result.token_ids, result.reason) == (plain.token_ids, plain.reason)
    assert 0 < result.accepted < result.drafted
    verifies = rows_seen[1:]  # the first forward is the prompt's prefill
    assert max(verifies) == SLACK + 2
    assert_holds_output(state, prompt, result)
    assert_exact(model, state, prompt)


# -- a reply cut by the context -------------------------------------------------------------


@pytest.mark.parametrize("speculate", [False, True])
def test_a_reply_cut_by_the_context_says_so(
    tiny_models: TinyModels, speculate: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if speculate:
        monkeypatch.setattr(decoding, "best_draft_length", lambda _a, _c, room, *_: room)
    model = load_model(tiny_models.gguf(qtype="F32")[0], EngineConfig(backend="numpy")).runner
    prompt = [5, 9, 14, 2, 77, 31]
    reference = decode_from(model, model.new_state(), prompt, 40)
    assert reference.reason == "length" and len(reference.token_ids) == 40
    script = [*prompt, *reference.token_ids]
    drafter = ScriptedDrafter(script) if speculate else None
    state = model.new_state()
    cut = decode_from(model, state, prompt, 40, drafter, context_limit=len(prompt) + 7)
    assert cut.reason == ev.FinishReason.CONTEXT_FULL == "context_full"
    assert cut.token_ids == reference.token_ids[:7]
    assert_holds_output(state, prompt, cut)
    drafter = ScriptedDrafter(script) if speculate else None
    capped = decode_from(model, model.new_state(), prompt, 7, drafter, context_limit=100)
    assert (capped.reason, capped.token_ids) == ("length", reference.token_ids[:7])


# -- the cost of a verify ---------------------------------------------------------------------


class FakeTime:
    """A clock that moves only when the model forwards (10 ms a call, whatever the rows) or
    the state is put right after a verify (50 ms)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.mark.usefixtures("longest_drafts")
def test_a_verify_is_weighed_with_its_rollback(
    tiny_models: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every draft is rejected, so every verify ends in rollback_retaining (a hybrid's tape
    replay): the cost model must see forward + rollback, 6x a plain step here (before: 1x,
    so a gate that should say "plain is faster" saw verifies as free)."""
    clock = FakeTime()
    monkeypatch.setattr(decoding, "time", clock)
    model = load_model(tiny_models.gguf(qtype="F32")[0], EngineConfig(backend="numpy")).runner
    forward, retain = model.forward, SequenceState.rollback_retaining

    def timed_forward(token_ids: list[int], state: SequenceState, logits: str = "last") -> Any:
        clock.now += 0.010
        return forward(token_ids, state, logits)

    def timed_retain(self: SequenceState, cp: Any, keep_rows: int) -> None:
        clock.now += 0.050
        retain(self, cp, keep_rows)

    model.forward = timed_forward  # type: ignore[method-assign]
    monkeypatch.setattr(SequenceState, "rollback_retaining", timed_retain)
    prompt = [5, 9, 14, 2, 77, 31]
    reference = decode_from(model, model.new_state(), prompt, 12)
    costs = CostModel()
    costs.observe(1, 0.010)
    drafter = ScriptedDrafter([*prompt, *reference.token_ids], corrupt=1.0)
    result = decode_from(model, model.new_state(), prompt, 12, drafter, costs)
    assert result.drafted > 0 and result.accepted == 0
    verified = [rows for rows in costs.ratios if rows > 1]
    assert verified
    for rows in verified:
        assert costs.ratios[rows] == pytest.approx(6.0)


# -- fitting the context: the reply's room ------------------------------------------------------

SENTENCE = "The sea is blue and the sky is wide. "


def settings(max_tokens: int, drop: bool = False) -> ev.GenerationSettings:
    return ev.GenerationSettings(
        GREEDY, max_tokens=max_tokens, drafter="off", drop_oldest_turns=drop
    )


def test_fitting_the_context_leaves_the_reply_room(tiny_models: TinyModels) -> None:
    """The tiny llama holds 512 tokens; a reply asks 64 (under a quarter of 512)."""
    path = tiny_models.gguf(qtype="F32")[0]
    chat = (
        user(SENTENCE * 8),
        ev.Message("assistant", "Indeed."),
        user(SENTENCE * 10),
    )
    num_full = len(prompt_ids(chat))
    assert num_full < 512 < num_full + 64  # it fits, with less room than the reply asks
    with Runner() as runner:
        runner.load(path)
        # allowed to drop turns: the oldest go until the reply has its room
        finished = runner.generate(chat, settings(64, drop=True))
        assert finished.stats is not None
        assert finished.stats.prompt_tokens == len(prompt_ids(chat[2:]))
        assert_same_reply(finished, fresh_finished(path, chat[2:], settings(64)))
        # not allowed: it runs with the room there is, and says where it was cut
        finished = runner.generate(chat, settings(64))
        assert finished.reason == "context_full"
        assert len(finished.token_ids) == 512 - num_full
        # Continue of the reply the context cut: no room without dropping turns (refused,
        # saying what to do), and with dropping allowed it goes on after the oldest go
        cut = (*chat, ev.Message("assistant", finished.text))
        go_on = dataclasses.replace(settings(64), continue_last=True)
        events = runner.request(ev.Generate("go-on", cut, go_on))
        assert isinstance(events[-1], ev.Failed)
        assert "drop the oldest turns" in events[-1].message
        dropping = dataclasses.replace(go_on, drop_oldest_turns=True)
        continued = runner.generate(cut, dropping)
        assert continued.stats is not None
        assert continued.stats.prompt_tokens < 512 - 64 and continued.token_ids
        # no room at all: refused, saying so
        crowded = (*chat[:2], user(SENTENCE * 13))
        assert len(prompt_ids(crowded)) >= 512
        events = runner.request(ev.Generate("crowded", crowded, settings(64)))
        assert isinstance(events[-1], ev.Failed)
        assert "leaves no room for a reply" in events[-1].message
        assert "drop the oldest turns" in events[-1].message
