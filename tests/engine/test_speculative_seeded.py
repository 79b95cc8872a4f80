"""Seeded sampling reproduces with speculation on (issue 16 point 7): the same seed gives
the same tokens for drafter off, prompt lookup and a draft model, for any draft lengths,
at several temperatures and with every transform, on full-attention and hybrid models,
through decode() and through the engine.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine import events as ev
from engine.drafters import Drafter, DraftModelDrafter
from engine.sampling import SamplingSettings
from tests.conftest import TinyModels
from tests.engine import test_speculative
from tests.engine.engine_runner import Runner, always_draft, user
from tests.engine.test_speculative import (
    Case,
    Pair,
    RandomK,
    ScriptedDrafter,
    assert_exact,
    assert_holds_output,
    primed_suffix_drafter,
    run,
)
from tests.hybrid_models import make_hybrid_dir
from tests.tiny_models import EOS_ID

# test_speculative's fixtures: the model pairs, their prompts, forced draft lengths
pair = test_speculative.pair
cases = test_speculative.cases
random_k = test_speculative.random_k

SAMPLED = {
    "hot": SamplingSettings(temperature=1.3, seed=11),
    "top_k_top_p": SamplingSettings(temperature=0.8, top_k=40, top_p=0.9, seed=12),
    "min_p_penalty": SamplingSettings(temperature=1.0, min_p=0.05, repetition_penalty=1.3, seed=13),
    "cool": SamplingSettings(temperature=0.3, top_p=0.95, seed=14),
}
DRAFTERS = ["suffix", "draft_model", "noisy_oracle"]
NUM_CASES = {"numpy": 6, "mlx": 4}  # prompts per test; MLX on the CPU is several times slower


@pytest.mark.parametrize("which", DRAFTERS)
@pytest.mark.parametrize("name", list(SAMPLED))
def test_seeded_speculative_decoding_equals_plain(
    pair: Pair, cases: list[Case], random_k: RandomK, name: str, which: str
) -> None:
    """Random draft lengths 0..8 every step: the tokens, the reason and the state are plain
    seeded decoding's; drafts are judged at several keep counts."""
    settings = SAMPLED[name]
    draft_model = DraftModelDrafter(pair.draft)
    num_drafted = num_accepted = 0
    for i, case in enumerate(cases[: NUM_CASES[pair.backend]]):
        seeded = dataclasses.replace(settings, seed=settings.seed + i)
        plain, _ = run(pair.target, case.prompt, case.max_tokens, settings=seeded)
        drafter: Drafter
        if which == "suffix":  # it saw this seed's reply before, a fifth of it changed
            drafter = primed_suffix_drafter(dataclasses.replace(case, reference=plain), i)
        elif which == "draft_model":
            drafter = draft_model
        else:  # the sampled reply itself, a third of it corrupted
            eos = [EOS_ID] if plain.reason == "eos" else []
            drafter = ScriptedDrafter([*case.prompt, *plain.token_ids, *eos], 0.3, seed=i)
        random_k.restart()
        result, state = run(pair.target, case.prompt, case.max_tokens, drafter, seeded)
        where = f"prompt {i} ({which}, {name})"
        assert result.token_ids == plain.token_ids, where
        assert result.reason == plain.reason, where
        assert_holds_output(state, case.prompt, result)
        assert_exact(pair.target, state, case.prompt)
        num_drafted += result.drafted
        num_accepted += result.accepted
    assert num_drafted > 0
    if which == "noisy_oracle":
        assert 0 < num_accepted < num_drafted


class UncoupledDraftModel(DraftModelDrafter):
    """The draft model without `couple`: greedy drafts whatever the temperature."""

    couple = None  # type: ignore[assignment]


@pytest.mark.parametrize("name", ["hot", "min_p_penalty"])
def test_a_coupled_draft_model_draws_what_the_target_draws(
    pair: Pair, cases: list[Case], random_k: RandomK, name: str
) -> None:
    """The target drafting for itself: coupled to the request's sampler, its drafts are the
    target's own draws, so every one stands; drafting greedily, those that are not the
    argmax fall. The reply is plain seeded decoding's either way."""
    settings = SAMPLED[name]
    num = {"coupled": [0, 0], "greedy": [0, 0]}  # accepted, drafted
    for i, case in enumerate(cases[: NUM_CASES[pair.backend] - 2]):
        seeded = dataclasses.replace(settings, seed=settings.seed + i)
        plain, _ = run(pair.target, case.prompt, case.max_tokens, settings=seeded)
        for kind, drafter in [
            ("coupled", DraftModelDrafter(pair.target)),
            ("greedy", UncoupledDraftModel(pair.target)),
        ]:
            random_k.restart()
            result, _ = run(pair.target, case.prompt, case.max_tokens, drafter, seeded)
            assert result.token_ids == plain.token_ids, (i, kind)
            num[kind][0] += result.accepted
            num[kind][1] += result.drafted
    assert num["coupled"][0] == num["coupled"][1] > 0
    assert num["greedy"][0] < num["greedy"][1]


def test_an_unseeded_request_samples_afresh(pair: Pair, cases: list[Case]) -> None:
    settings = SamplingSettings(temperature=1.5)
    case = cases[0]
    replies = {tuple(run(pair.target, case.prompt, 24, settings=settings)[0].token_ids)}
    replies |= {tuple(run(pair.target, case.prompt, 24, settings=settings)[0].token_ids)}
    assert len(replies) == 2


# -- through the engine: drafter off, lookup, draft model -----------------------------------


@pytest.fixture(scope="module")
def target_and_draft(
    request: pytest.FixtureRequest,
    tiny_models: TinyModels,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[Path, Path]]:
    hybrid = tmp_path_factory.mktemp("seeded_hybrid")
    for seed in (0, 1):
        make_hybrid_dir(hybrid / f"seed{seed}", "hf", seed=seed)
    llama = tuple(tiny_models.gguf(qtype="F32", seed=seed)[0] for seed in (0, 1))
    return {"llama": (llama[0], llama[1]), "hybrid": (hybrid / "seed0", hybrid / "seed1")}


@pytest.mark.parametrize("kind", ["llama", "hybrid"])
def test_the_same_seed_gives_the_same_reply_with_every_drafter(
    kind: str, target_and_draft: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every request drafts all it can (always_draft); a chat that repeats itself gives the
    lookup drafter matches, and each seed's reply is regenerated with every drafter."""
    always_draft(monkeypatch)
    target, draft = target_and_draft[kind]
    sentence = "The sea is blue and the sky is wide. "
    messages = (user(sentence * 4 + "Say it again."),)
    with Runner() as runner:
        runner.engine.submit(ev.LoadModel(str(target), draft_model_path=str(draft)))
        while not isinstance(event := runner.next_event(), ev.ModelLoaded):
            assert not isinstance(event, ev.Failed), event
        assert event.draft_model
        num_drafted = {"lookup": 0, "draft_model": 0}
        for name, sampling in SAMPLED.items():
            replies = {}
            for drafter in ("off", "lookup", "draft_model", "off"):
                settings = ev.GenerationSettings(sampling, max_tokens=24, drafter=drafter)
                finished = runner.generate(messages, settings)
                assert finished.stats is not None
                if drafter != "off":
                    num_drafted[drafter] += finished.stats.drafted
                replies.setdefault(drafter, finished.token_ids)
                assert finished.token_ids == replies["off"], f"{name}, {drafter}"
    assert num_drafted["lookup"] > 0 and num_drafted["draft_model"] > 0
