"""A pool of drafters (engine/drafter_pool.py): each round the member whose own acceptance
and cost promise the most proposes, a member with nothing to propose gives way, every
member follows the context, and the output stays plain decoding's token for token."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.draft_costs import AcceptanceModel
from engine.drafter_pool import DrafterPool, Member
from engine.drafters import Draft
from engine.loader import load_model
from tests.conftest import TinyModels
from tests.engine.test_draft_length import cost_model, cpu_linear, gpu_flat
from tests.engine.test_speculative import ScriptedDrafter, make_prompts, run
from tests.tiny_models import EOS_ID


@pytest.fixture(scope="module")
def target(tiny_models: TinyModels) -> Any:
    return load_model(
        tiny_models.gguf(qtype="F32", seed=0)[0], EngineConfig(backend="numpy")
    ).runner


@pytest.fixture(scope="module")
def cases(target: Any) -> list[tuple[list[int], int, list[int]]]:
    """(prompt, max_tokens, the target's plain greedy script: prompt, reply and EOS)."""
    out = []
    for prompt, max_tokens in make_prompts(6, seed=3):
        reference, _ = run(target, prompt, max_tokens)
        eos = [EOS_ID] if reference.reason == "eos" else []
        out.append((prompt, max_tokens, [*prompt, *reference.token_ids, *eos]))
    return out


class Silent:
    """A drafter with nothing to propose (prompt lookup without a match)."""

    def __init__(self) -> None:
        self.asked = 0
        self.committed: list[int] = []

    def begin(self, context: list[int]) -> None:
        self.committed = list(context)

    def propose(self, pending: int, k: int) -> Draft:
        self.asked += 1
        return Draft([])

    def commit(self, tokens: list[int]) -> None:
        self.committed += tokens

    def end(self) -> None:
        pass


class Watching(ScriptedDrafter):
    """An oracle that wants the target's hidden rows, counting those it is handed."""

    wants_hidden = True

    def __init__(self, script: list[int]) -> None:
        super().__init__(script)
        self.rows = 0

    def observe_hidden(self, rows: Any, start: int | None = None) -> None:
        self.rows += int(np.asarray(rows).shape[0])


def test_the_pool_learns_which_member_pays_and_keeps_the_output(target: Any, cases) -> None:
    for prompt, max_tokens, script in cases:
        wrong, right = ScriptedDrafter(script, corrupt=1.0), ScriptedDrafter(script)
        pool = DrafterPool([Member("wrong", wrong), Member("right", right)])  # wrong first
        result, state = run(target, prompt, max_tokens, pool, costs=cost_model(gpu_flat))
        assert [*prompt, *result.token_ids] == script[: len(prompt) + len(result.token_ids)]
        assert result.accepted >= len(result.token_ids) // 2
        # the adversary opens (a tie goes to the first), misses once, and is dropped
        assert pool.proposals["wrong"] == 1 and pool.proposals["right"] >= 2
        assert len(wrong.proposals) == pool.proposals["wrong"]
        assert wrong.position == right.position == len(state.tokens)  # both followed along


class Unsure(ScriptedDrafter):
    """An oracle that doubts itself: each draft says its rows are barely likely, so the
    decode loop cuts it to one row (decoding.cut_draft)."""

    def propose(self, pending: int, k: int) -> Draft:
        tokens = super().propose(pending, k).tokens
        return Draft(tokens, [0.02**j for j in range(1, len(tokens) + 1)])


def test_a_member_whose_drafts_are_cut_short_gives_way_to_whole_drafts(target: Any, cases) -> None:
    """The cut rows of a draft count as missed in its member's acceptance: a member whose
    every kept row is right, but who is cut to one row a round, loses to one drafting
    whole (as prompt lookup does, copying text the block drafter doubts)."""
    for prompt, max_tokens, script in cases:
        unsure, whole = Unsure(script), ScriptedDrafter(script)
        pool = DrafterPool([Member("unsure", unsure), Member("whole", whole)])  # unsure first
        result, _ = run(target, prompt, max_tokens, pool, costs=cost_model(gpu_flat))
        assert [*prompt, *result.token_ids] == script[: len(prompt) + len(result.token_ids)]
        assert all(len(p) > 1 for p in unsure.proposals)  # asked for more, cut to one
        assert pool.proposals["unsure"] == 1 < pool.proposals["whole"]
        assert result.accepted == result.drafted


def test_a_member_with_nothing_to_propose_gives_way(target: Any, cases) -> None:
    prompt, max_tokens, script = cases[0]
    silent, right = Silent(), ScriptedDrafter(script)
    pool = DrafterPool([Member("silent", silent), Member("right", right)])
    result, state = run(target, prompt, max_tokens, pool, costs=cost_model(gpu_flat))
    assert [*prompt, *result.token_ids] == script[: len(prompt) + len(result.token_ids)]
    assert silent.asked > 0 and pool.proposals["silent"] == 0
    assert result.accepted > 0 and pool.proposals["right"] > 0
    assert silent.committed == state.tokens  # it saw every committed token all the same


class Free(ScriptedDrafter):
    """An oracle whose drafts cost no model forward, as prompt lookup's."""

    drafts_for_free = True


class FreeSilent(Silent):
    drafts_for_free = True


class OnePass(ScriptedDrafter):
    """An oracle that drafts in one model pass, as the block drafter."""

    drafts_in_one_pass = True


def test_a_free_member_with_a_draft_goes_before_a_model_ranked_above_it(target: Any, cases) -> None:
    """Prompt lookup's rate is measured on the rounds it had a match, and there the block
    drafter's drafts are rarely right: a free member that pays and has a draft proposes
    first, whatever the ranking says; without a draft it gives way to the model."""
    prompt, max_tokens, script = cases[0]
    model, free = OnePass(script), Free(script)
    trusted = AcceptanceModel(accepted=50.0, trials=50.0)  # ranked first by far
    pool = DrafterPool([Member("model", model, trusted), Member("free", free)])
    result, _ = run(target, prompt, max_tokens, pool, costs=cost_model(gpu_flat))
    assert [*prompt, *result.token_ids] == script[: len(prompt) + len(result.token_ids)]
    assert pool.proposals["model"] == 0 and pool.proposals["free"] >= 2
    model, silent = OnePass(script), FreeSilent()
    pool = DrafterPool([Member("model", model, trusted), Member("free", silent)])
    result, _ = run(target, prompt, max_tokens, pool, costs=cost_model(gpu_flat))
    assert silent.asked >= 2 and pool.proposals["model"] >= 2 and pool.proposals["free"] == 0


class AskedK(Silent):
    """Drafts k tokens when asked for k, keeping what it was asked."""

    def __init__(self, free: bool = False, max_draft: int = 16) -> None:
        super().__init__()
        self.drafts_for_free, self.max_draft, self.asked_k = free, max_draft, []

    def propose(self, pending: int, k: int) -> Draft:
        self.asked_k.append(k)
        return Draft([pending] * k)


def test_each_member_drafts_its_own_k_whichever_is_ranked_first() -> None:
    """The pool's k is the largest of its members' best k; the member that proposes is
    asked for its own (a free member going first is not capped by the model's k)."""
    model, free = AskedK(max_draft=2), AskedK(free=True)
    pool = DrafterPool(
        [
            Member("model", model, AcceptanceModel(accepted=50.0, trials=50.0)),
            Member("free", free, AcceptanceModel(accepted=6.0, trials=10.0)),
        ]
    )
    costs = cost_model(gpu_flat)
    k = pool.choose_k(costs, 15)
    assert [c.member.name for c in pool._ranked] == ["model", "free"]  # the model ranks first
    free_k = next(c.k for c in pool._ranked if c.member.name == "free")
    assert free_k > 2 and k == free_k
    assert len(pool.propose(7, k).tokens) == free_k and free.asked_k == [free_k]
    assert model.asked_k == [] and pool.last is pool.members[1]


def test_hidden_rows_reach_only_the_members_that_want_them(target: Any, cases) -> None:
    prompt, max_tokens, script = cases[1]
    watching, plain = Watching(script), Silent()  # Silent has no observe_hidden: a call fails
    pool = DrafterPool([Member("plain", plain), Member("watching", watching)])
    assert pool.wants_hidden
    result, state = run(target, prompt, max_tokens, pool, costs=cost_model(gpu_flat))
    assert result.accepted > 0
    assert watching.rows == len(state.tokens)  # the prompt's rows, then each kept row


def test_where_no_member_pays_nothing_is_drafted(target: Any, cases) -> None:
    prompt, max_tokens, script = cases[2]
    right = ScriptedDrafter(script)
    pool = DrafterPool([Member("right", right, AcceptanceModel(accepted=50.0, trials=50.0))])
    result, _ = run(target, prompt, max_tokens, pool, costs=cost_model(cpu_linear))
    assert result.drafted == 0 and not right.proposals  # a verify costs its rows' steps
    assert [*prompt, *result.token_ids] == script[: len(prompt) + len(result.token_ids)]


def test_a_k_forced_from_outside_goes_to_the_member_with_the_best_rate(
    target: Any, cases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `choose_k` (a tool forcing the draft length, as tools/drafter's
    engine_accuracy does): the members by acceptance rate, each up to the forced k."""
    from engine import decoding

    monkeypatch.setattr(decoding, "_choose_k", lambda req, *_: 3)
    prompt, max_tokens, script = cases[3]
    right, wrong = ScriptedDrafter(script), ScriptedDrafter(script, corrupt=1.0)
    pool = DrafterPool([Member("wrong", wrong), Member("right", right)])
    assert pool.max_draft == 16  # neither caps its drafts: decoding's MAX_DRAFT
    result, _ = run(target, prompt, max_tokens, pool)
    assert [*prompt, *result.token_ids] == script[: len(prompt) + len(result.token_ids)]
    assert all(len(p) <= 3 for p in right.proposals + wrong.proposals)
    assert pool.proposals["wrong"] == 1 and pool.proposals["right"] >= 3


def test_each_member_learns_its_own_acceptance() -> None:
    a, b = Member("a", Silent()), Member("b", Silent())
    pool = DrafterPool([a, b])
    pool.last = b
    pool.acceptance.observe(4, 0)
    assert a.acceptance.trials == 0 and b.acceptance.trials == 1
    assert b.acceptance.rate < a.acceptance.rate
    pool.acceptance.forget()
    assert a.acceptance.rate == b.acceptance.rate == 0.5
    with pytest.raises(ValueError, match="at least one drafter"):
        DrafterPool([])


def test_the_block_choice_pools_the_block_drafter_with_lookup(
    tiny_models: TinyModels, tmp_path: Any
) -> None:
    """Settings' "block": the trained drafter, and prompt lookup where it promises more."""
    from engine import events as ev
    from engine.drafter_file import target_signature
    from engine.session import Session
    from tests.block_drafters import write_drafter

    model_path = tiny_models.gguf(qtype="F32", seed=0)[0]
    plain = load_model(model_path, EngineConfig(backend="numpy"))
    signature = target_signature(plain.config, plain.tokenizer)
    drafter = write_drafter(tmp_path / "d.safetensors", plain.config, signature, block=6)
    config = EngineConfig(backend="numpy", block_drafter=str(drafter))
    session = Session(load_model(model_path, config), config=config)
    pool, acceptance = session._drafter(ev.DrafterKind.BLOCK)
    assert isinstance(pool, DrafterPool) and acceptance is pool.acceptance
    members = {m.name: m for m in pool.members}
    assert members["block"].drafter is session.block_drafter
    assert members["lookup"].drafter is session.lookup
    assert members["lookup"].acceptance is session.acceptance[ev.DrafterKind.LOOKUP]
    assert session._drafter(ev.DrafterKind.AUTO)[0] is session.lookup  # not measured paying
    # its block member's pass runs on the device: a queued step would hold it up
    # (engine/decoding.py); lookup alone walks an index on the host
    assert not pool.drafts_for_free and session.lookup.drafts_for_free
    assert DrafterPool([members["lookup"]]).drafts_for_free
    # the drafter's context rows count in the memory budget's live state
    events: list[Any] = []
    settings = ev.GenerationSettings(max_tokens=6, drafter="block", raw=True)
    request = ev.Generate("r", (ev.Message("user", "the cat sat on the mat"),), settings)
    session.generate(request, events.append, lambda: False)
    assert any(isinstance(e, ev.Finished) for e in events)
    rows = session.block_drafter.nbytes() if session.block_drafter is not None else 0
    live = sum(layer.nbytes() for layer in session.state.layers)
    assert rows > 0 and session.enforce_memory().kv == live + rows
    config = EngineConfig(backend="mlx", dtype="float32", block_drafter=str(drafter))
    session = Session(load_model(model_path, config), config=config)
    assert isinstance(session._drafter(ev.DrafterKind.BLOCK)[0], DrafterPool)
    assert session._drafter(ev.DrafterKind.AUTO)[0] is session.lookup  # not measured there
    # BRANCHCHAT_AUTO_BLOCK=1 puts it in Auto (a GPU round measures both ways)
    with_block = dataclasses.replace(config, auto_block=True)
    auto = Session(load_model(model_path, with_block), config=with_block)._drafter(
        ev.DrafterKind.AUTO
    )[0]
    assert isinstance(auto, DrafterPool) and {m.name for m in auto.members} == {"lookup", "block"}
    on_cpu = EngineConfig(backend="numpy", block_drafter=str(drafter), auto_block=True)
    auto = Session(load_model(model_path, on_cpu), config=on_cpu)._drafter(ev.DrafterKind.AUTO)
    assert isinstance(auto[0], DrafterPool) and auto[1] is auto[0].acceptance
    assert EngineConfig.from_environment({"BRANCHCHAT_AUTO_BLOCK": "1"}).auto_block is True


def test_auto_pools_a_loaded_draft_model_with_lookup(tiny_models: TinyModels) -> None:
    """Auto with a draft model loaded: the draft model pooled with prompt lookup (lookup's
    matches first, a regenerate's copy); the "draft model" choice is the model alone.
    Greedy output is plain decoding's either way."""
    from engine import events as ev
    from engine.session import Session

    config = EngineConfig(backend="numpy")
    target = load_model(tiny_models.gguf(qtype="F32", seed=0)[0], config)
    draft = load_model(tiny_models.gguf(qtype="F32", seed=1)[0], config)
    session = Session(target, draft=draft, config=config)
    session.costs = cost_model(gpu_flat)  # a verify as cheap as a step: drafting pays
    auto, acceptance = session._drafter(ev.DrafterKind.AUTO)
    assert isinstance(auto, DrafterPool) and acceptance is auto.acceptance
    assert [m.name for m in auto.members] == ["draft_model", "lookup"]
    assert [m.drafter for m in auto.members] == [session.draft_drafter, session.lookup]
    assert session._drafter(ev.DrafterKind.DRAFT_MODEL)[0] is session.draft_drafter
    replies = {}
    for choice in ("off", "auto"):
        events: list[Any] = []
        settings = ev.GenerationSettings(max_tokens=12, drafter=choice, raw=True)
        request = ev.Generate(choice, (ev.Message("user", "the cat sat on the mat"),), settings)
        session.generate(request, events.append, lambda: False)
        replies[choice] = next(e for e in events if isinstance(e, ev.Finished))
    assert replies["auto"].token_ids == replies["off"].token_ids
    assert replies["auto"].stats is not None and replies["auto"].stats.drafted > 0
    plain = Session(target, config=config)  # no draft model, no block drafter: lookup alone
    assert plain._drafter(ev.DrafterKind.AUTO)[0] is plain.lookup


def test_a_draft_model_is_tried_by_its_size_until_its_drafts_are_timed(
    tiny_models: TinyModels,
) -> None:
    """Before its first draft is timed, a drafted token is taken to cost the draft model's
    weight bytes over the target's, in plain steps: one as large as the target is never
    tried (a try forwards it the whole prompt), a quarter of its size is; greedy output is
    plain decoding's either way."""
    from engine import events as ev
    from engine.session import Session

    config = EngineConfig(backend="numpy")
    target = load_model(tiny_models.gguf(qtype="F32", seed=0)[0], config)
    replies = {}
    for name, qtype in (("large", "F32"), ("small", "Q8_0")):
        draft = load_model(tiny_models.gguf(qtype=qtype, seed=1)[0], config)
        session = Session(target, draft=draft, config=config)
        session.costs = cost_model(gpu_flat)  # a verify as cheap as a step
        prior = session.acceptance[ev.DrafterKind.DRAFT_MODEL].prior_steps
        assert prior == pytest.approx(draft.weight_bytes / target.weight_bytes)
        events: list[Any] = []
        settings = ev.GenerationSettings(max_tokens=12, drafter="draft_model", raw=True)
        request = ev.Generate(name, (ev.Message("user", "the cat sat on the mat"),), settings)
        session.generate(request, events.append, lambda: False)
        replies[name] = next(e for e in events if isinstance(e, ev.Finished))
        assert session.draft_drafter is not None
        tried = replies[name].stats.drafted > 0
        assert tried == (name == "small"), (name, prior)
        assert (session.draft_drafter.state.tokens != []) == tried  # untried: forwarded nothing
    assert replies["large"].token_ids == replies["small"].token_ids
