"""Greedy steps queued ahead (engine/runner/ahead.py, decoding._plain_run): the next step is
on the device before the host reads the token it takes. The reply, its finish reason and
the state it leaves are those of synchronous decoding, bit for bit, on every layer kind
(full attention, a sliding ring, a hybrid's recurrent layers), at every way a reply ends
(EOS, the token limit, the context, a stop), on the model's own MLX path and the fused
five-kernel path (on a CPU their MLX-ops reference; the one-launch step on a CUDA GPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from engine import decoding, device_sampling
from engine.config import EngineConfig
from engine.decoding import DecodeRequest, DecodeResult, decode
from engine.draft_costs import AcceptanceModel, CostModel
from engine.drafters import Draft
from engine.events import FinishReason
from engine.loader import load_model
from engine.runner import ModelRunner
from engine.runner.ahead import DeviceDraw, Launch, StepTimedOut
from engine.sampling import SamplingSettings
from engine.sequence import SequenceState, prefill
from engine.state import SnapshotPolicy
from kernels import fused_decode_cuda
from tests.conftest import TinyModels
from tests.engine.test_speculative import ScriptedDrafter
from tests.tiny_families import make_family_hf

GREEDY = SamplingSettings()
PROMPT = [int(t) for t in np.random.default_rng(5).integers(3, 200, 21)]


def _runner(path: Path, fused: str | None = None) -> ModelRunner:
    # float32 on the model's own path (MLX's CPU default); the one-launch step's own dtype
    dtype = None if fused == "step" else "float32"
    runner = load_model(path, EngineConfig(backend="mlx", dtype=dtype)).runner
    runner.fused = None  # the loader may have enabled it (CUDA)
    if fused:
        runner.enable_fused_decode(compiled=False, mode=fused)
    return runner


ON_CUDA = fused_decode_cuda.is_available()
PATHS = ["llama", "llama-fused", "sliding", "gemma3", "hybrid"]
PATHS += ["llama-step", "gemma3-step", "hybrid-step"] if ON_CUDA else []


@pytest.fixture(params=PATHS)
def runner(request: Any, tiny_models: TinyModels, models: dict, tmp_path: Path) -> ModelRunner:
    name, _, step = request.param.partition("-")
    fused = {"fused": "layers", "step": "step"}.get(step)
    if name == "llama":
        return _runner(tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")[0], fused)
    if name == "sliding":
        return _runner(tiny_models.hf("llama", sliding_window=8)[0])
    if name == "gemma3":
        make_family_hf(tmp_path / "g", "gemma3", tie=True, sliding_window=8)
        return _runner(tmp_path / "g", fused)
    return _runner(models["hybrid"], fused)


def _decode(
    runner: ModelRunner,
    max_tokens: int,
    eos: frozenset[int] = frozenset(),
    context_limit: int = 1 << 30,
    stop_after: int | None = None,
    drafter: Any = None,
    settings: SamplingSettings = GREEDY,
) -> tuple[DecodeResult, SequenceState]:
    state = runner.new_state(SnapshotPolicy(sliding_slack=4))
    last = np.asarray(runner.ops.to_numpy(prefill(runner, state, PROMPT)), np.float64)
    emitted: list[int] = []
    req = DecodeRequest(
        settings=settings,
        max_tokens=max_tokens,
        eos_ids=eos,
        emit=lambda ids, _flags: emitted.extend(ids),
        should_stop=lambda: stop_after is not None and len(emitted) >= stop_after,
        drafter=drafter,
        acceptance=AcceptanceModel() if drafter is not None else None,
        context_limit=context_limit,
    )
    out = decode(runner, state, last.reshape(-1), req, CostModel())
    assert emitted == out.token_ids
    return out, state


def _synchronous(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Any:
    with monkeypatch.context() as m:
        m.setattr(ModelRunner, "can_launch_ahead", lambda self, state, taps=None: False)
        return _decode(runner, **kw)


def _next_logits(runner: ModelRunner, state: SequenceState, token: int) -> np.ndarray:
    return np.array(runner.ops.to_numpy(runner.forward([token], state)))


def _assert_same(runner: ModelRunner, got: Any, want: Any) -> None:
    (out, state), (ref, ref_state) = got, want
    assert out.token_ids == ref.token_ids and out.reason == ref.reason
    # the state holds every produced token but the pending one (or the EOS) and continues
    # as the synchronous one does, bit for bit
    assert state.tokens == ref_state.tokens
    held = len(state.tokens) - len(PROMPT)
    assert held == len(out.token_ids) - (out.reason != FinishReason.EOS)
    assert state.tokens == PROMPT + out.token_ids[:held]
    token = 3
    np.testing.assert_array_equal(
        _next_logits(runner, state, token), _next_logits(runner, ref_state, token)
    )


def test_queued_steps_give_the_synchronous_reply_and_state(runner, monkeypatch):
    launches: list[bool] = []  # per launch: was its input still on the device
    real = ModelRunner.launch

    def counting(
        self: ModelRunner, ids: Any, state: SequenceState, draw: Any = None, taps: Any = None
    ) -> Launch:
        launches.append(isinstance(ids, mx.array))
        return real(self, ids, state, draw, taps)

    monkeypatch.setattr(ModelRunner, "launch", counting)
    got = _decode(runner, max_tokens=20)
    # one host token to start, then every step queued on its input as the device holds it
    assert launches == [False] + [True] * 18
    monkeypatch.undo()
    assert got[0].reason == FinishReason.LENGTH and len(got[0].token_ids) == 20
    _assert_same(runner, got, _synchronous(runner, monkeypatch, max_tokens=20))


def test_each_step_is_queued_before_the_token_it_takes_is_read(runner, monkeypatch):
    events: list[str] = []
    real_launch, real_read = ModelRunner.launch, Launch.read

    def launch(
        self: ModelRunner, ids: Any, state: SequenceState, draw: Any = None, taps: Any = None
    ) -> Launch:
        events.append("launch")
        return real_launch(self, ids, state, draw, taps)

    def read(self: Launch) -> int:
        events.append("read")
        return real_read(self)

    monkeypatch.setattr(ModelRunner, "launch", launch)
    monkeypatch.setattr(Launch, "read", read)
    _decode(runner, max_tokens=6)
    assert events == ["launch"] + ["launch", "read"] * 4 + ["read"]


@pytest.mark.parametrize(
    "ending",
    [{"stop_after": 7}, {"context_limit": len(PROMPT) + 9}, {"max_tokens": 1}, {"eos": True}],
    ids=["stopped", "context", "one-token", "eos"],
)
def test_a_reply_ending_mid_run_leaves_the_synchronous_state(runner, monkeypatch, ending):
    kw: dict[str, Any] = {"max_tokens": 30, **ending}
    if kw.pop("eos", False):  # the reply's 6th token ends it, with a step queued on it
        kw["eos"] = frozenset({_synchronous(runner, monkeypatch, max_tokens=6)[0].token_ids[5]})
    want = _synchronous(runner, monkeypatch, **kw)
    got = _decode(runner, **kw)
    expected = {"stop_after": FinishReason.STOPPED, "context_limit": FinishReason.CONTEXT_FULL}
    for key, reason in expected.items():
        if key in ending:
            assert got[0].reason == reason
    if "eos" in kw:
        assert got[0].reason == FinishReason.EOS and len(got[0].token_ids) <= 5
    if len(got[0].token_ids):
        _assert_same(runner, got, want)


def test_a_timed_out_step_is_taken_back_and_redone(tiny_models, monkeypatch):
    """A queued one-launch step whose barrier timed out: its row leaves the state, the path
    falls back, and the step is redone; the reply is the synchronous one."""
    runner = _runner(tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")[0], "layers")
    want = _synchronous(runner, monkeypatch, max_tokens=12)
    reads, fell_back = [0], []
    real_read = Launch.read

    def read(self: Launch) -> int:
        reads[0] += 1
        if reads[0] == 4:
            raise StepTimedOut("a barrier timed out")
        return real_read(self)

    monkeypatch.setattr(Launch, "read", read)
    monkeypatch.setattr(ModelRunner, "fall_back", lambda self: fell_back.append(True))
    got = _decode(runner, max_tokens=12)
    assert fell_back == [True]
    monkeypatch.undo()
    _assert_same(runner, got, want)


class SometimesDrafter(ScriptedDrafter):
    """Proposes the script's continuation at every other position, and nothing between
    (prompt lookup without a match); on the host alone, as lookup does."""

    drafts_for_free = True

    def propose(self, pending: int, k: int) -> Draft:
        return super().propose(pending, k) if self.position % 2 else Draft([])


class SeeingDrafter(SometimesDrafter):
    """A drafter that reads the target's rows (a block drafter's contract): it records
    every row it is handed. Its pass runs on the device, as a block drafter's does."""

    wants_hidden = True
    drafts_for_free = False

    def __init__(self, script: list[int], taps: tuple[int, ...]) -> None:
        super().__init__(script, corrupt=0.5, seed=1)
        self.taps = taps
        self.rows: list[np.ndarray] = []

    def observe_hidden(self, rows: Any, start: int | None = None) -> None:
        assert start is None  # the prompt's rows are not part of this test
        self.rows.append(np.array(rows, dtype=np.float32))


@pytest.mark.parametrize("taps", [(), (0, 1)], ids=["last-layer", "tapped"])
def test_steps_queued_for_a_drafter_that_reads_rows_hand_it_a_forwards_rows(
    runner, monkeypatch, taps
):
    """Plain steps are queued for a drafter that reads the target's rows too: each step
    hands it the rows `forward_hidden` gives, bit for bit, with its token. The reply and
    state are the same drafting's without queued steps. A path that cannot hand out the
    tapped layers' rows (the one-launch step) refuses them, queued or not: such a drafter
    is refused at load (ModelRunner.tap_problem, block_drafter.load)."""
    if runner.tap_problem(taps):
        with pytest.raises(ValueError, match="last layer's rows alone"):
            # rows the fused path takes (a prompt's prefill takes the model's own path)
            runner.forward_hidden(PROMPT[:4], runner.new_state(), "last", taps)
        return
    plain = _synchronous(runner, monkeypatch, max_tokens=30)[0].token_ids
    script = PROMPT + plain

    chosen: list[Any] = []

    def choose_k(req: Any, costs: Any, produced: int, *_: Any) -> int:
        chosen.append(k := 3 if produced % 9 in (4, 5, 6, 7) else 0)
        return k

    monkeypatch.setattr(decoding, "_choose_k", choose_k)
    sync_drafter = SeeingDrafter(script, taps)
    want = _synchronous(runner, monkeypatch, max_tokens=30, drafter=sync_drafter)
    kinds = _count_launches(monkeypatch)
    chosen.clear()
    real_launch = ModelRunner.launch  # as counted: each launch after the k it followed

    def launch(self: ModelRunner, ids: Any, *args: Any) -> Launch:
        chosen.append("queued" if isinstance(ids, mx.array) else "host")
        return real_launch(self, ids, *args)

    monkeypatch.setattr(ModelRunner, "launch", launch)
    drafter = SeeingDrafter(script, taps)
    got = _decode(runner, max_tokens=30, drafter=drafter)
    monkeypatch.undo()
    assert got[0].token_ids == plain
    _assert_same(runner, got, want)
    assert len(drafter.rows) == len(sync_drafter.rows) > 10
    for mine, theirs in zip(drafter.rows, sync_drafter.rows, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert kinds.count("queued") >= 10
    # its pass would wait behind a queued step: none is queued where it may draft
    assert not [i for i, e in enumerate(chosen) if e == "queued" and chosen[i - 1] == 3]
    assert chosen.count(3) >= 6


SAMPLED = SamplingSettings(temperature=0.8, top_p=0.9, top_k=40, min_p=0.02, seed=7)


def _count_launches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """'queued' for a launch on the step before's token as the device holds it, else 'host'."""
    kinds: list[str] = []
    real = ModelRunner.launch

    def launch(
        self: ModelRunner, ids: Any, state: SequenceState, draw: Any = None, taps: Any = None
    ) -> Launch:
        kinds.append("queued" if isinstance(ids, mx.array) else "host")
        return real(self, ids, state, draw, taps)

    monkeypatch.setattr(ModelRunner, "launch", launch)
    return kinds


def test_sampled_steps_queued_on_the_devices_draw_give_the_hosts_tokens(runner, monkeypatch):
    want = _synchronous(runner, monkeypatch, max_tokens=24, settings=SAMPLED)
    kinds = _count_launches(monkeypatch)
    got = _decode(runner, max_tokens=24, settings=SAMPLED)
    monkeypatch.undo()
    _assert_same(runner, got, want)
    # the device's draws were the host's: every step after the first queued on its draw
    assert kinds == ["host"] + ["queued"] * 22


def every_third_draw_wrong(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The device's draw made wrong (one token off) every third call; the calls, counted."""
    real_draw, calls = device_sampling.draw, [0]

    def sometimes_wrong(s: SamplingSettings, u: float) -> Any:
        calls[0] += 1
        right, wrong = real_draw(s, u), calls[0] % 3 == 0

        def run(row: mx.array) -> tuple[mx.array, mx.array | None]:
            token, packed = right(row)
            return (mx.where(token > 0, token - 1, token + 1) if wrong else token), packed

        return DeviceDraw(run)

    monkeypatch.setattr(device_sampling, "draw", sometimes_wrong)
    return calls


def test_a_device_draw_the_host_does_not_make_is_undone(runner, monkeypatch):
    """A queued step on a token the host did not draw is taken back and launched again on
    the host's token: the reply and the state are the synchronous ones."""
    want = _synchronous(runner, monkeypatch, max_tokens=24, settings=SAMPLED)
    calls = every_third_draw_wrong(monkeypatch)
    kinds = _count_launches(monkeypatch)
    got = _decode(runner, max_tokens=24, settings=SAMPLED)
    monkeypatch.undo()
    _assert_same(runner, got, want)
    relaunched = kinds.count("host") - 1  # each after a wrong draw the reply went on from
    assert 3 <= relaunched <= calls[0] // 3


def test_a_repetition_penalty_keeps_sampled_steps_synchronous(runner, monkeypatch):
    penalized = SamplingSettings(temperature=0.8, repetition_penalty=1.3, seed=3)
    want = _synchronous(runner, monkeypatch, max_tokens=12, settings=penalized)
    kinds = _count_launches(monkeypatch)
    got = _decode(runner, max_tokens=12, settings=penalized)
    monkeypatch.undo()
    assert kinds == []
    _assert_same(runner, got, want)


def test_BRANCHCHAT_QUEUE_STEPS_0_decodes_one_forward_a_step(tiny_models, monkeypatch):
    config = EngineConfig.from_environment({"BRANCHCHAT_QUEUE_STEPS": "0"}, backend="mlx")
    runner = load_model(tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")[0], config).runner
    state = runner.new_state()
    assert config.queue_steps is False and not runner.can_launch_ahead(state)
    kinds = _count_launches(monkeypatch)
    got, _ = _decode(runner, max_tokens=8)
    assert kinds == [] and len(got.token_ids) == 8
    on = EngineConfig.from_environment({}, backend="mlx")
    assert on.queue_steps and load_model(tiny_models.gguf()[0], on).runner.can_launch_ahead(state)
