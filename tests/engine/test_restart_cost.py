"""A verify stops the queue of plain steps: the plain run after it starts with a step the
host waits for whole. That wait, beyond a queued step's cost, is charged to the verify
(`CostModel.charge`), not taken as a plain step's cost, so a draft's price includes the
queue it breaks."""

from __future__ import annotations

import time
from typing import Any

import pytest

from engine import decoding, verify_rows
from engine.draft_costs import CostModel
from engine.drafters import Draft
from engine.sampling import SamplingSettings
from tests.engine.test_launch_ahead import PROMPT, SometimesDrafter, _decode, _synchronous
from tests.engine.test_launch_ahead import runner as runner  # the fixture: every layer kind


def test_a_charge_adds_to_the_last_observation_of_its_rows() -> None:
    costs = CostModel(decay=0.8)
    costs.observe(1, 0.001)
    costs.observe(4, 0.002)
    assert costs.cost(4) == pytest.approx(0.002)
    costs.charge(4, 0.0005)  # as if that verify had taken 2.5 ms
    assert costs.cost(4) == pytest.approx(0.002 + 0.2 * 0.0005)
    costs.charge(3, 0.01)  # never observed: nothing to add to
    costs.charge(1, 0.01)  # a plain step's cost is its own
    assert costs.seconds == pytest.approx({1: 0.001, 4: 0.0021})


def test_the_run_after_a_verify_charges_its_first_step_to_the_verify(
    runner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _synchronous(runner, monkeypatch, max_tokens=40)[0].token_ids
    log: list[tuple[str, int, float]] = []
    observe, charge = CostModel.observe, CostModel.charge

    def observing(self: CostModel, rows: int, seconds: float) -> None:
        log.append(("observe", rows, seconds))
        observe(self, rows, seconds)

    def charging(self: CostModel, rows: int, seconds: float) -> None:
        log.append(("charge", rows, seconds))
        charge(self, rows, seconds)

    monkeypatch.setattr(CostModel, "observe", observing)
    monkeypatch.setattr(CostModel, "charge", charging)
    monkeypatch.setattr(
        decoding, "_choose_k", lambda req, costs, produced, *_: 3 * (produced % 9 in (4, 5))
    )
    got = _decode(runner, max_tokens=40, drafter=SometimesDrafter(PROMPT + plain, 0.5, 1))[0]
    monkeypatch.undo()
    assert got.token_ids == plain and got.drafted >= 6
    verifies = [i for i, (kind, rows, _) in enumerate(log) if kind == "observe" and rows > 1]
    charges = [i for i, (kind, _, _) in enumerate(log) if kind == "charge"]
    assert len(verifies) >= 3 and charges
    for i in charges:  # each right after its verify, with its rows, never negative
        assert log[i - 1][0] == "observe" and log[i - 1][1] == log[i][1] > 1 and log[i][2] >= 0
    # the run after a verify does not take its first step as a plain step's cost
    assert not any(log[i + 1][:2] == ("observe", 1) for i in verifies if i + 1 < len(log))


class EchoDrafter:
    """Proposes the pending token k times at every other position (nothing between): drafts
    a sampled reply accepts now and then, whatever its tokens."""

    name = "echo"
    drafts_for_free = True

    def __init__(self) -> None:
        self.position = 0

    def begin(self, context: list[int]) -> None:
        self.position = len(context)

    def propose(self, pending: int, k: int) -> Draft:
        return Draft([pending] * k if self.position % 2 else [])

    def commit(self, tokens: list[int]) -> None:
        self.position += len(tokens)

    def end(self) -> None:
        pass


def test_the_hosts_draws_are_part_of_a_steps_and_a_verifys_cost(
    runner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sampled verify's draws on the host (its rejection sampling) are the verify's cost,
    as a plain step's draw is the step's: with the verify's left out, a sampled verify read
    cheaper than the plain steps it replaces, and Auto lost on a sampled open chat (0.96x
    on an Intel Xeon). Each draw here takes 10 ms more: every observed cost holds one."""
    log: list[tuple[int, float]] = []
    observe = CostModel.observe

    def observing(self: CostModel, rows: int, seconds: float) -> None:
        log.append((rows, seconds))
        observe(self, rows, seconds)

    monkeypatch.setattr(CostModel, "observe", observing)
    for name in ("verify", "token", "host_draw"):
        real = getattr(verify_rows, name)

        def slow(*args: Any, _real: Any = real, **kw: Any) -> Any:
            time.sleep(0.01)
            return _real(*args, **kw)

        monkeypatch.setattr(verify_rows, name, slow)
    monkeypatch.setattr(
        decoding, "_choose_k", lambda req, costs, produced, *_: 2 * (produced % 7 in (3, 4))
    )
    sampled = SamplingSettings(temperature=0.8, top_p=0.9, seed=3)
    _decode(runner, max_tokens=24, drafter=EchoDrafter(), settings=sampled)
    monkeypatch.undo()
    # plain steps and verifies of 2 drafts (behind the step queued on their pending token)
    assert {rows for rows, _ in log} >= {1, 2}
    assert all(seconds >= 0.01 for _, seconds in log), log
