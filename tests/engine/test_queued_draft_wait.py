"""A draft proposed on a queued step's token (decoding._plain_run) is verified at once, the
step queued on that token undone, only where that gains more than verifying it a token
later (decoding._verifies_now): a draft whose first token is unlikely leaves the queued
step standing, and the reply and state stay plain greedy decoding's bit for bit.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from engine import decoding
from engine.config import EngineConfig
from engine.decoding import DecodeRequest, decode
from engine.draft_costs import AcceptanceModel, CostModel
from engine.drafters import Draft
from engine.loader import load_model
from engine.runner import ModelRunner
from engine.runner.ahead import Launch
from engine.sequence import prefill
from engine.state import SnapshotPolicy
from tests.conftest import TinyModels
from tests.engine.test_launch_ahead import GREEDY, PROMPT, SometimesDrafter


class FixedCosts(CostModel):
    """One row costs 1 s, each further row 0.1 s; nothing observed changes that."""

    def cost(self, rows: int) -> float:
        return 1.0 + 0.1 * (rows - 1)

    def observe(self, rows: int, seconds: float) -> None:
        pass

    def charge(self, rows: int, seconds: float) -> None:
        pass


def _draft(confidence: list[float]) -> Draft:
    return Draft(list(range(7, 7 + len(confidence))), confidence, free=True)


def test_verified_now_where_that_gains_more_than_a_token_later() -> None:
    costs = FixedCosts()
    # sure of its first token, the rest likely: now 2.55 - 1.3 s against 1.65 - 0.9 x 1.2
    assert decoding._verifies_now(_draft([0.9, 0.85, 0.8]), costs)
    # its first token unlikely, the rest likely once it comes true: later gains 0.09 s,
    # now loses 0.55 s
    assert not decoding._verifies_now(_draft([0.3, 0.25, 0.2]), costs)
    # one token never pays now, however sure: its verify (1.1 s) outcosts the step it undoes
    assert not decoding._verifies_now(_draft([1.0]), costs)
    # nothing to verify; a drafter without a confidence: now, as before the rule
    assert not decoding._verifies_now(_draft([]), costs)
    assert decoding._verifies_now(Draft([7, 8]), costs)


class ConfidentDrafter(SometimesDrafter):
    """SometimesDrafter's drafts, each with the given confidence (prompt lookup's form)."""

    def __init__(self, script: list[int], confidence: list[float]) -> None:
        super().__init__(script, 0.5, 1)
        self.confidence = confidence

    def propose(self, pending: int, k: int) -> Draft:
        tokens = super().propose(pending, k).tokens
        return Draft(tokens, self.confidence[: len(tokens)], free=True)


def _run(runner: ModelRunner, drafter: Any, log: list[str]) -> tuple[Any, Any]:
    state = runner.new_state(SnapshotPolicy(sliding_slack=4))
    last = np.asarray(runner.ops.to_numpy(prefill(runner, state, PROMPT)), np.float64)
    req = DecodeRequest(
        GREEDY, 40, frozenset(), lambda *_: None, lambda: False, drafter, AcceptanceModel()
    )
    del log[:]
    return decode(runner, state, last.reshape(-1), req, FixedCosts()), state


@pytest.mark.parametrize("sure", [False, True], ids=["unlikely-first", "likely"])
def test_a_draft_unlikely_to_start_right_leaves_the_queued_step(
    tiny_models: TinyModels, monkeypatch: pytest.MonkeyPatch, sure: bool
) -> None:
    config = EngineConfig(backend="mlx", dtype="float32")
    runner = load_model(tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")[0], config).runner
    runner.fused = None  # the model's own path, queued (a CUDA machine's loader may fuse)
    log: list[str] = []
    real_launch, real_cancel = ModelRunner.launch, Launch.cancel

    def launch(self: ModelRunner, ids: Any, state: Any, draw: Any = None, taps: Any = None) -> Any:
        log.append("queued" if isinstance(ids, mx.array) else "host")
        return real_launch(self, ids, state, draw, taps)

    def cancel(self: Launch) -> None:
        log.append("cancel")
        real_cancel(self)

    monkeypatch.setattr(ModelRunner, "launch", launch)
    monkeypatch.setattr(Launch, "cancel", cancel)
    plain, plain_state = _run(runner, None, log)
    assert "cancel" not in log and log.count("queued") >= 30
    monkeypatch.setattr(
        decoding, "_choose_k", lambda req, costs, produced, *_: 3 if produced % 9 in (4, 5) else 0
    )
    confidence = [0.9, 0.85, 0.8] if sure else [0.3, 0.25, 0.2]
    got, state = _run(runner, ConfidentDrafter(PROMPT + plain.token_ids, confidence), log)
    assert got.token_ids == plain.token_ids and state.tokens == plain_state.tokens
    if sure:  # verified at once: each such draft undid the step queued on its token
        assert got.verifies >= 3 and log.count("cancel") == got.verifies
    else:  # never verified: every queued step stood
        assert got.verifies == got.drafted == 0 and "cancel" not in log
        assert log.count("queued") >= 30
