"""Queued steps under a pool of drafters (engine/drafter_pool.py, engine/decoding.py's
`_plain_run`): where the members the cost model ranks this round all draft on the host
(prompt lookup), the next step is queued before the draft is asked for, as for lookup
alone, though the pool also holds a drafter whose pass runs on the device (the block
drafter); only a round that ranks that one stops the queue. The reply and state are the
synchronous decoding's with the same pool. A draft proposed on a queued step's token is
priced by its proposal alone."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from engine.decoding import DecodeRequest, decode
from engine.draft_costs import AcceptanceModel, CostModel
from engine.drafter_pool import DrafterPool, Member
from engine.drafters import Draft
from engine.runner import ModelRunner
from engine.sampling import SamplingSettings
from engine.sequence import prefill
from tests.engine.test_launch_ahead import (
    PROMPT,
    SeeingDrafter,
    SometimesDrafter,
    _assert_same,
    _count_launches,
    _decode,
    _synchronous,
)
from tests.engine.test_launch_ahead import runner as runner  # the fixture, every path
from tests.engine.test_queued_first_row import assert_equals_a_fresh_prefill
from tests.engine.test_speculative import ScriptedDrafter

# a verify's rows as a GPU prices them against a step (the H100's, session 27)
RATIOS = {1: 1.0, 2: 1.30, 4: 1.70, 8: 2.28, 16: 3.29}


class DeviceDrafter(SeeingDrafter):
    """Reads the target's rows, its pass on the device; proposes at every position."""

    def propose(self, pending: int, k: int) -> Draft:
        return ScriptedDrafter.propose(self, pending, k)


def _pool(script: list[int], device_pass_seconds: float) -> DrafterPool:
    """Lookup-like (on the host, proposing every other position) and a drafter whose pass
    runs on the device and reads the target's rows, priced at `device_pass_seconds`."""
    lookup = Member("lookup", SometimesDrafter(script, 0.5, 1))
    seeing = Member("block", DeviceDrafter(script, ()))
    seeing.acceptance.pass_seconds = device_pass_seconds
    return DrafterPool([lookup, seeing])


@pytest.fixture
def fixed_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Costs as set, not as this machine measures them (what the choice is made of)."""

    def calibrated(self: CostModel) -> None:
        self.step_seconds, self.ratios = 1e-3, dict(RATIOS)

    monkeypatch.setattr(CostModel, "observe", lambda self, rows, seconds: calibrated(self))
    monkeypatch.setattr(CostModel, "charge", lambda self, rows, seconds: None)


@pytest.mark.parametrize("device_pass_ms", [1000.0, 0.0], ids=["unpaid-pass", "free-pass"])
def test_a_round_lookup_alone_drafts_keeps_the_queue(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch, fixed_costs: None, device_pass_ms: float
) -> None:
    plain = _synchronous(runner, monkeypatch, max_tokens=40)[0].token_ids
    script = PROMPT + plain
    sync_pool = _pool(script, device_pass_ms / 1e3)
    want = _synchronous(runner, monkeypatch, max_tokens=40, drafter=sync_pool)
    log: list[Any] = _count_launches(monkeypatch)  # and each round's choice among them
    real_choose = DrafterPool.choose_k

    def choose_k(self: DrafterPool, costs: CostModel, room: int) -> int:
        k = real_choose(self, costs, room)
        log.append(("k", k, self.round_is_free))
        return k

    monkeypatch.setattr(DrafterPool, "choose_k", choose_k)
    pool = _pool(script, device_pass_ms / 1e3)
    got = _decode(runner, max_tokens=40, drafter=pool)
    monkeypatch.undo()
    assert got[0].token_ids == plain
    if got[0].drafted == want[0].drafted and runner.fused is not None:  # bit for bit
        _assert_same(runner, got, want)
    else:  # a round more or less near the end (the room left counts from another token), or
        # a lookup draft's rows forwarded behind the step queued on its pending token
        assert_equals_a_fresh_prefill(runner, got[1])
    rounds = [e for e in log if isinstance(e, tuple) and e[1]]
    after = [log[i + 1] for i, e in enumerate(log[:-1]) if isinstance(e, tuple) and e[1]]
    # the drafter that reads the target's rows got one a kept position, as synchronously
    # (a lookup draft's first row from the step queued on its pending token)
    seen = [np.concatenate(p.members[1].drafter.rows) for p in (pool, sync_pool)]
    assert seen[0].shape == seen[1].shape == (len(plain) - 1, seen[0].shape[1])
    np.testing.assert_allclose(seen[0], seen[1], rtol=1e-3, atol=1e-3)
    if device_pass_ms:  # the device's drafter never pays: every drafting round is lookup's
        assert len(rounds) >= 10 and all(free for _, _, free in rounds)
        assert pool.proposals["block"] == 0 and pool.proposals["lookup"] >= 3
        # queued though lookup may draft after it (before: none, the pool was not free)
        assert after.count("queued") >= 6
    else:  # a free pass ranks the device's drafter: its rounds stop the queue
        assert rounds and not any(free for _, _, free in rounds)
        assert "queued" not in after and pool.proposals["block"] >= 1


def test_a_queued_runs_draft_costs_its_proposal_alone(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch, fixed_costs: None
) -> None:
    """A draft proposed on a queued step's token is timed from the proposal, not from the
    token's read: the token's emission (the app's text, its events) is every step's cost.
    Counted as drafting, a slow emission priced prompt lookup's tokens near a GPU step's,
    and Auto stopped drafting on a GPU (code: 0 tokens drafted)."""
    plain = _synchronous(runner, monkeypatch, max_tokens=30)[0].token_ids
    drafter = SometimesDrafter(PROMPT + plain, 0.0, 1)  # free; every other position
    acceptance = AcceptanceModel()
    req = DecodeRequest(
        settings=SamplingSettings(),
        max_tokens=30,
        eos_ids=frozenset(),
        emit=lambda ids, flags: time.sleep(0.02),  # a slow window: 20 ms a token
        should_stop=lambda: False,
        drafter=drafter,
        acceptance=acceptance,
    )
    state = runner.new_state()
    last = np.asarray(runner.ops.to_numpy(prefill(runner, state, PROMPT)), np.float64)
    out = decode(runner, state, last.reshape(-1), req, CostModel())
    assert out.token_ids == plain and out.drafted >= 4
    assert acceptance.token_seconds < 0.005  # a proposal's microseconds, not 20 ms
