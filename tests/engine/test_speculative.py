"""Speculative decoding (docs/DESIGN.md, "Speculative decoding contracts"): greedy output is
token-identical to plain decoding for every drafter and draft length, the state (and a
draft model's) is exact after every partial accept and holds exactly the reply, and a
request's drafting follows its acceptance. Seeded sampling with speculation on is in
test_speculative_seeded.py, coupled sampling's distribution in
test_speculative_sampling.py, the draft length in test_draft_length.py, the default model
in test_speculative_real_model.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import decoding, verify_rows
from engine.block_drafter import CapturingForward
from engine.config import EngineConfig
from engine.decoding import DecodeRequest, DecodeResult, decode
from engine.draft_costs import AcceptanceModel, CostModel
from engine.drafters import Draft, Drafter, DraftModelDrafter
from engine.loader import load_model
from engine.sampling import SamplingSettings
from engine.sequence import SequenceState, prefill
from engine.suffix_drafter import SuffixDrafter
from tests.conftest import TinyModels
from tests.engine.state_reference import assert_next_logits_exact
from tests.engine.test_draft_length import cost_model, cpu_linear, gpu_flat
from tests.hybrid_models import make_hybrid_dir
from tests.tiny_models import EOS_ID, VOCAB_SIZE
from tests.tolerances import compute_dtype

TOLERANCE = 1e-4  # max abs logit diff against a fresh prefill (float32, docs/DESIGN.md)


GREEDY = SamplingSettings()
MODELS = [("llama", "numpy"), ("llama", "mlx"), ("hybrid", "numpy"), ("hybrid", "mlx")]
NUM_PROMPTS = {"numpy": 20, "mlx": 6}  # MLX on the CPU is several times slower
MAX_FORCED_K = 8


# -- fixtures ---------------------------------------------------------------------------


@dataclass
class Pair:
    """A target model and a draft model of the same vocabulary (another seed)."""

    target: Any
    draft: Any
    backend: str


@pytest.fixture(scope="module", params=MODELS, ids=lambda p: f"{p[0]}-{p[1]}")
def pair(
    request: pytest.FixtureRequest,
    tiny_models: TinyModels,
    tmp_path_factory: pytest.TempPathFactory,
) -> Pair:
    family, backend = request.param
    paths: list[Path] = []
    for seed in (0, 1):
        if family == "llama":
            paths.append(tiny_models.gguf(qtype="F32", seed=seed)[0])
        else:  # recurrent layers: partial accepts replay the verify tape
            path = tmp_path_factory.mktemp("hybrid") / f"seed{seed}"
            make_hybrid_dir(path, seed=seed)
            paths.append(path)
    target, draft = (load_model(p, EngineConfig(backend=backend)).runner for p in paths)
    if not target.verify_is_exact():  # bf16 on a GPU without the fused kernels
        pytest.skip("the session refuses speculation here (verify rows are not exact)")
    return Pair(target, draft, backend)


@dataclass
class Case:
    prompt: list[int]
    max_tokens: int
    reference: DecodeResult  # plain greedy decoding


def make_prompts(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens); every third prompt repeats a stretch, so lookup finds matches."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        body = [int(t) for t in rng.integers(3, VOCAB_SIZE, int(rng.integers(4, 20)))]
        if i % 3 == 0:
            body += body[: int(rng.integers(2, len(body) + 1))]
        out.append((body, int(rng.integers(16, 41))))
    return out


@pytest.fixture(scope="module")
def cases(pair: Pair) -> list[Case]:
    out = []
    for prompt, max_tokens in make_prompts(NUM_PROMPTS[pair.backend]):
        reference, _ = run(pair.target, prompt, max_tokens)
        out.append(Case(prompt, max_tokens, reference))
    return out


class RandomK:
    """Stands in for best_draft_length: draft lengths 0..8 in a seeded random order."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.rng = np.random.default_rng(7)

    def __call__(self, alpha: float, costs: CostModel, available: int, *_: float) -> int:
        return min(available, int(self.rng.integers(0, MAX_FORCED_K + 1)))


@pytest.fixture
def random_k(monkeypatch: pytest.MonkeyPatch) -> RandomK:
    """Force draft lengths whatever the cost model says (nor does a drafter's confidence
    cut them: decoding.cut_draft)."""
    pick = RandomK()
    monkeypatch.setattr(decoding, "best_draft_length", pick)
    monkeypatch.setattr(decoding, "cut_draft", lambda draft, _costs, queued=False: draft)
    return pick


@pytest.fixture
def keep_counts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records keep_rows of every rollback_retaining (each partial accept)."""
    seen: list[int] = []
    original = SequenceState.rollback_retaining

    def spy(self: SequenceState, cp: Any, keep_rows: int) -> None:
        seen.append(keep_rows)
        original(self, cp, keep_rows)

    monkeypatch.setattr(SequenceState, "rollback_retaining", spy)
    return seen


# -- helpers ----------------------------------------------------------------------------


def as_f64(model: Any, logits: Any) -> np.ndarray:
    return np.asarray(model.ops.to_numpy(logits), dtype=np.float64).reshape(-1)


def run(
    model: Any,
    prompt: list[int],
    max_tokens: int,
    drafter: Drafter | None = None,
    settings: SamplingSettings = GREEDY,
    costs: CostModel | None = None,
    eos: int = EOS_ID,
) -> tuple[DecodeResult, SequenceState]:
    """Prefill a fresh state with `prompt` and decode from it; the result and the state."""
    state = model.new_state()
    prompt_hidden: list[tuple[int, Any]] = []  # a block drafter's context: the prompt's rows
    forward = model
    if getattr(drafter, "wants_hidden", False):
        forward = CapturingForward(
            model, lambda *rows: prompt_hidden.append(rows), getattr(drafter, "taps", ())
        )
    last = as_f64(model, prefill(forward, state, prompt))
    emitted: list[int] = []
    from_draft: list[bool] = []

    def emit(ids: list[int], flags: list[bool]) -> None:
        emitted.extend(ids)
        from_draft.extend(flags)

    req = DecodeRequest(
        settings=settings,
        max_tokens=max_tokens,
        eos_ids=frozenset({eos}),
        emit=emit,
        should_stop=lambda: False,
        drafter=drafter,
        # a pool of drafters brings the acceptance model that routes to its members
        acceptance=getattr(drafter, "acceptance", None) or AcceptanceModel() if drafter else None,
        prompt_hidden=prompt_hidden,
    )
    result = decode(model, state, last, req, costs or CostModel())
    assert emitted == result.token_ids
    assert result.accepted == sum(from_draft)  # every accepted draft was emitted
    return result, state


def assert_exact(model: Any, state: SequenceState, prompt: list[int], probe: int = 5) -> None:
    """The state's next-token logits (after a probe) are those of recomputing it: in float32
    a fresh prefill of its tokens; in bfloat16 (the fused step on a GPU, whose rounding a
    prefill's MLX matmuls do not share, and a hybrid's recurrence carries from step to step)
    plain decoding's, the prompt prefilled and each later token a single step, bit for bit:
    what a verify's rows must equal for greedy speculation to be exact."""
    assert not state.is_recording
    dtype = compute_dtype(model.ops)
    if dtype == "float16":  # float16 K/V: the row-by-row check
        assert_next_logits_exact(model, state, probe)
        return
    cp = state.checkpoint()
    got = as_f64(model, model.forward([probe], state, logits="last"))
    state.rollback(cp)
    assert state.tokens[: len(prompt)] == prompt
    if dtype == "float32":
        want = as_f64(model, prefill(model, model.new_state(), [*state.tokens, probe]))
        diff = np.max(np.abs(got - want))
        assert diff <= TOLERANCE, f"logits after decoding differ from a fresh prefill by {diff:.3g}"
        return
    replay = model.new_state()
    prefill(model, replay, prompt)
    for token in [*state.tokens[len(prompt) :], probe]:
        last = model.forward([token], replay, logits="last")
    np.testing.assert_array_equal(got, as_f64(model, last), "not plain decoding's state")


def assert_holds_output(state: SequenceState, prompt: list[int], result: DecodeResult) -> None:
    """The decode loop's invariant: the state holds the prompt and every produced token but
    the last, the pending one (after an EOS: every emitted token, and nothing past them)."""
    produced = [*prompt, *result.token_ids]
    if result.reason == "eos":
        assert state.tokens == produced
    else:
        assert state.tokens == produced[:-1]


class ScriptedDrafter:
    """Proposes the continuation of a known sequence: the target's own greedy output.

    Each proposed token is replaced by a different random one with probability
    `corrupt`: 0 is an oracle (every draft accepted), 1 an adversary (every draft
    rejected), in between partial accepts at random keep counts.
    """

    name = "scripted"

    def __init__(self, script: list[int], corrupt: float = 0.0, seed: int = 0) -> None:
        self.script = script
        self.corrupt = corrupt
        self.rng = np.random.default_rng(seed)
        self.position = 0  # tokens in the target's state
        self.proposals: list[list[int]] = []

    def begin(self, context: list[int]) -> None:
        assert context == self.script[: len(context)]
        self.position = len(context)

    def propose(self, pending: int, k: int) -> Draft:
        assert self.script[self.position] == pending
        tokens = self.script[self.position + 1 : self.position + 1 + k]
        for i, token in enumerate(tokens):
            if self.rng.random() < self.corrupt:
                tokens[i] = (token + int(self.rng.integers(1, VOCAB_SIZE))) % VOCAB_SIZE
        self.proposals.append(tokens)
        return Draft(tokens)

    def commit(self, tokens: list[int]) -> None:
        assert tokens == self.script[self.position : self.position + len(tokens)]
        self.position += len(tokens)

    def end(self) -> None:
        pass


def script_of(case: Case) -> list[int]:
    eos = [EOS_ID] if case.reference.reason == "eos" else []
    return [*case.prompt, *case.reference.token_ids, *eos]


def primed_suffix_drafter(case: Case, index: int) -> SuffixDrafter:
    """A lookup drafter that (for even prompts) saw an earlier sibling reply: the reference
    with a fifth of its tokens changed, as after an edit and regenerate."""
    drafter = SuffixDrafter()
    if index % 2 == 0:
        rng = np.random.default_rng(index)
        sibling = [
            int(rng.integers(3, VOCAB_SIZE)) if rng.random() < 0.2 else t
            for t in case.reference.token_ids
        ]
        drafter.begin(case.prompt)
        drafter.commit(sibling)
        drafter.end()
    return drafter


# -- greedy: token-identical, exact state -----------------------------------------------

DRAFTERS = ["suffix", "draft_model", "oracle", "noisy_oracle", "adversarial"]


@pytest.mark.usefixtures("random_k")
@pytest.mark.parametrize("which", DRAFTERS)
def test_greedy_speculative_equals_plain(
    pair: Pair,
    cases: list[Case],
    keep_counts: list[int],
    which: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    draft_model = DraftModelDrafter(pair.draft)  # one for all prompts: begin() rewinds it
    num_drafted = num_accepted = 0
    verifies: list[int] = []  # one a verify forward
    verify = verify_rows.verify
    monkeypatch.setattr(verify_rows, "verify", lambda *a: (verifies.append(1), verify(*a))[1])
    for i, case in enumerate(cases):
        drafter: Drafter
        if which == "suffix":
            drafter = primed_suffix_drafter(case, i)
        elif which == "draft_model":
            drafter = draft_model
        else:
            corrupt = {"oracle": 0.0, "noisy_oracle": 0.3, "adversarial": 1.0}[which]
            drafter = ScriptedDrafter(script_of(case), corrupt, seed=i)
        verifies.clear()
        result, state = run(pair.target, case.prompt, case.max_tokens, drafter)
        where = f"prompt {i} ({which})"
        assert result.token_ids == case.reference.token_ids, where
        assert result.verifies == len(verifies), where  # each round that drafted, counted
        assert result.reason == case.reference.reason, where
        assert_holds_output(state, case.prompt, result)
        assert_exact(pair.target, state, case.prompt)
        if which == "draft_model":  # the draft model's own rollback kept it exact
            draft_model.sync()  # (what the request committed last is queued until needed)
            assert draft_model.state.tokens == state.tokens, where
            assert_exact(pair.draft, draft_model.state, case.prompt)
        if which == "oracle":
            assert result.accepted == result.drafted, where
        if which == "adversarial":
            assert result.accepted == 0, where
        num_drafted += result.drafted
        num_accepted += result.accepted

    assert num_drafted > 0
    if which in ("suffix", "noisy_oracle"):  # partial accepts, at many keep counts
        assert 0 < num_accepted < num_drafted
        assert len(set(keep_counts)) >= 4, sorted(set(keep_counts))


@pytest.mark.usefixtures("random_k")
@pytest.mark.parametrize("corrupt", [0.0, 0.3])
def test_end_of_sequence_inside_a_draft(pair: Pair, cases: list[Case], corrupt: float) -> None:
    """A token of the reference output made the EOS: drafts that run past it are cut there.
    The state holds exactly the reply (no row verified past the EOS), stays exact, and
    `accepted` counts only drafts that were emitted (checked by run)."""
    num_past_eos = 0
    for i, case in enumerate(cases[:8]):
        tokens = case.reference.token_ids
        eos = tokens[len(tokens) // 2]
        stop = tokens.index(eos)
        plain, _ = run(pair.target, case.prompt, case.max_tokens, eos=eos)
        assert (plain.token_ids, plain.reason) == (tokens[:stop], "eos")
        drafter = ScriptedDrafter([*case.prompt, *tokens], corrupt, seed=i)
        result, state = run(pair.target, case.prompt, case.max_tokens, drafter, eos=eos)
        assert (result.token_ids, result.reason) == (tokens[:stop], "eos"), f"prompt {i}"
        assert_holds_output(state, case.prompt, result)
        assert_exact(pair.target, state, case.prompt)
        num_past_eos += any(eos in draft[:-1] for draft in drafter.proposals)
    if corrupt == 0.0:  # the oracle's drafts ran past the EOS
        assert num_past_eos > 0


# -- acceptance per request, on real models ---------------------------------------------


def test_a_new_request_starts_from_the_prior(pair: Pair, cases: list[Case]) -> None:
    """After a request whose drafts all failed, the next (a regenerate) drafts at once."""
    case = cases[0]
    acceptance = AcceptanceModel()
    for _ in range(20):
        acceptance.observe(drafted=4, accepted=0)
    state = pair.target.new_state()
    last = as_f64(pair.target, prefill(pair.target, state, case.prompt))
    req = DecodeRequest(
        settings=GREEDY,
        max_tokens=case.max_tokens,
        eos_ids=frozenset({EOS_ID}),
        emit=lambda _ids, _flags: None,
        should_stop=lambda: False,
        drafter=ScriptedDrafter(script_of(case)),
        acceptance=acceptance,
    )
    result = decode(pair.target, state, last, req, cost_model(gpu_flat))
    assert result.token_ids == case.reference.token_ids
    assert result.accepted == result.drafted >= len(result.token_ids) // 2


def test_fresh_text_with_linear_cost_drafts_nothing(pair: Pair, cases: list[Case]) -> None:
    """With a CPU-like cost, decoding never pays for a verify: exactly plain decoding."""
    for case in cases[:4]:
        drafter = primed_suffix_drafter(case, 0)  # it has matches to offer
        costs = cost_model(cpu_linear)
        result, _ = run(pair.target, case.prompt, case.max_tokens, drafter, costs=costs)
        assert result.drafted == 0
        assert result.token_ids == case.reference.token_ids
