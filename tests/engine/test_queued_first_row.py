"""A draft proposed on a queued step's token (engine/decoding.py's `_plain_run`) is verified
behind that step: the step stands as the verify's first row, and the verify's pass forwards
the drafted tokens alone (engine/verify_rows.Headed). Greedy and sampled, the reply is the
synchronous decoding's with the same drafter. Where the device drew a token the host did
not, the step is undone and the pass takes the pending token again; where the step's
kernel timed out, the verify is taken back with it, and the path falls back."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from engine import decoding, verify_rows
from engine.runner import ModelRunner
from engine.runner.ahead import Launch, StepTimedOut
from engine.sequence import SequenceState, prefill
from tests.engine.test_launch_ahead import (
    PROMPT,
    SAMPLED,
    SometimesDrafter,
    _assert_same,
    _decode,
    _next_logits,
    _runner,
    _synchronous,
    every_third_draw_wrong,
)
from tests.engine.test_launch_ahead import runner as runner  # the fixture, every path
from tests.tolerances import assert_logits_close, compute_dtype


def _now_and_then(req: Any, costs: Any, produced: int, *_: Any) -> int:
    return 3 if produced % 9 in (4, 5, 6, 7) else 0  # drafts of 3 now and then


def _logged(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Launches ('queued' on the step before's token as the device holds it, else 'host'),
    undone steps ('cancel') and forwards (('forward', rows)), in order."""
    log: list[Any] = []
    real_launch, real_cancel, real_forward = ModelRunner.launch, Launch.cancel, ModelRunner.forward

    def launch(self: ModelRunner, ids: Any, *args: Any) -> Launch:
        log.append("queued" if isinstance(ids, mx.array) else "host")
        return real_launch(self, ids, *args)

    def cancel(self: Launch) -> None:
        log.append("cancel")
        real_cancel(self)

    def forward(self: ModelRunner, ids: Any, state: SequenceState, **kw: Any) -> Any:
        log.append(("forward", len(ids)))
        return real_forward(self, ids, state, **kw)

    monkeypatch.setattr(ModelRunner, "launch", launch)
    monkeypatch.setattr(Launch, "cancel", cancel)
    monkeypatch.setattr(ModelRunner, "forward", forward)
    return log


def _assert_state(runner: ModelRunner, got: Any, want: Any) -> None:
    """The synchronous drafting's state: bit for bit on a fused path (its rows are single
    steps' in any row count), else its tokens, and logits within the dtype's rounding."""
    if runner.fused is not None:
        _assert_same(runner, got, want)
    else:
        assert got[1].tokens == want[1].tokens
        assert_equals_a_fresh_prefill(runner, got[1])


def test_a_step_queued_where_the_next_may_draft_is_the_drafts_first_row(runner, monkeypatch):
    """A step is queued ahead even where the cost model would draft after it: the drafter
    is asked once the token is read; with nothing to propose the queued step stands, and
    with a draft it stands too, as the verify's first row: the verify's pass forwards the
    drafted tokens alone behind it, nothing is undone. The reply is plain greedy and the
    state that of the same drafting without queued steps (its rows taken in other row
    counts: bit for bit on a fused path, else within the dtype's rounding)."""
    plain = _synchronous(runner, monkeypatch, max_tokens=40)[0].token_ids
    script = PROMPT + plain
    monkeypatch.setattr(decoding, "_choose_k", _now_and_then)
    want = _synchronous(
        runner, monkeypatch, max_tokens=40, drafter=SometimesDrafter(script, 0.5, 1)
    )
    log = _logged(monkeypatch)

    def choose_k(*args: Any) -> int:
        log.append(k := _now_and_then(*args))
        return k

    monkeypatch.setattr(decoding, "_choose_k", choose_k)
    got = _decode(runner, max_tokens=40, drafter=SometimesDrafter(script, 0.5, 1))
    monkeypatch.undo()
    assert got[0].token_ids == plain
    assert got[0].drafted == want[0].drafted >= 9
    _assert_state(runner, got, want)
    queued_where_k = [i for i, e in enumerate(log) if e == "queued" and log[i - 1] == 3]
    assert len(queued_where_k) >= 6  # queued though the next step could draft
    # each draft's verify came right after the step queued on its pending token, and
    # forwarded its 3 drafted tokens alone; no queued step was undone (none ended a reply)
    verifies = [log[i + 1] for i in queued_where_k if isinstance(log[i + 1], tuple)]
    assert len(verifies) >= 3 and set(verifies) == {("forward", 3)}
    assert "cancel" not in log


def assert_equals_a_fresh_prefill(runner: ModelRunner, state: SequenceState) -> None:
    """The state's next logits are a fresh prefill's of its tokens (rows computed in
    forwards of other row counts: within the dtype's rounding, not bit for bit)."""
    fresh = runner.new_state()
    prefill(runner, fresh, state.tokens)
    got, want = _next_logits(runner, state, 3), _next_logits(runner, fresh, 3)
    assert_logits_close(got, want, compute_dtype(runner.ops), runner.config.hidden_size)


@pytest.mark.parametrize("wrong", [False, True], ids=["device-draws", "some-draws-wrong"])
def test_a_sampled_draft_is_verified_behind_the_step_queued_on_its_token(
    runner, monkeypatch, wrong
):
    """Sampled, the verify's first row is the host's draw from the queued step's logits row,
    as a plain step's token is: the reply, drafts and accepts are the synchronous decoding's.
    Where the device's draw was not the host's (every third draw made wrong), the step is
    undone and the draft's pass forwards the pending token again."""
    plain = _synchronous(runner, monkeypatch, max_tokens=30, settings=SAMPLED)[0].token_ids
    script = PROMPT + plain
    monkeypatch.setattr(decoding, "_choose_k", _now_and_then)
    want = _synchronous(
        runner,
        monkeypatch,
        max_tokens=30,
        settings=SAMPLED,
        drafter=SometimesDrafter(script, 0.3, 2),
    )
    if wrong:
        every_third_draw_wrong(monkeypatch)
    log = _logged(monkeypatch)
    got = _decode(runner, max_tokens=30, settings=SAMPLED, drafter=SometimesDrafter(script, 0.3, 2))
    monkeypatch.undo()
    assert got[0].token_ids == plain
    assert got[0].drafted == want[0].drafted >= 9 and got[0].accepted == want[0].accepted
    _assert_state(runner, got, want)
    behind = [i for i, e in enumerate(log) if e == ("forward", 3) and log[i - 1] == "queued"]
    assert len(behind) >= 2  # verified behind a step queued on the draft's pending token
    again = [i for i, e in enumerate(log) if e == ("forward", 4) and log[i - 1] == "cancel"]
    assert bool(again) == wrong  # the device's token was not the host's: undone, and redone


def test_a_first_row_that_timed_out_is_taken_back_with_its_verify(tiny_models, monkeypatch):
    """The one-launch step queued on a draft's pending token timed out at a grid barrier:
    read as the verify's first row, the verify's rows and its own leave the state, the path
    falls back, and the reply goes on as plain greedy from the pending token."""
    runner = _runner(tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")[0], "layers")
    plain = _synchronous(runner, monkeypatch, max_tokens=30)[0].token_ids
    monkeypatch.setattr(decoding, "_choose_k", _now_and_then)
    heads: list[Launch] = []
    real_headed, real_read = verify_rows.Headed.__init__, Launch.read

    def headed(self: Any, head: Launch, rows: Any) -> None:
        heads.append(head)
        real_headed(self, head, rows)

    def read(self: Launch) -> int:
        if heads and self is heads[0] and len(heads) == 1:
            heads.append(self)  # once
            raise StepTimedOut("a barrier timed out")
        return real_read(self)

    fell_back: list[bool] = []
    monkeypatch.setattr(verify_rows.Headed, "__init__", headed)
    monkeypatch.setattr(Launch, "read", read)
    monkeypatch.setattr(ModelRunner, "fall_back", lambda self: fell_back.append(True))
    got, state = _decode(runner, max_tokens=30, drafter=SometimesDrafter(PROMPT + plain, 0.5, 1))
    monkeypatch.undo()
    assert fell_back == [True] and len(heads) >= 3 and heads[0] is heads[1]
    assert got.token_ids == plain
    assert state.tokens == PROMPT + plain[:-1]
    assert_equals_a_fresh_prefill(runner, state)
