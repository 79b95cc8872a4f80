"""`CostModel.calibrate`: a GPU's first forward of each shape compiles (the H200's fused
step took 1-4 s for a one-row "all" call, and the one-row cost then read 3.4 s, so every
verify looked free to the cost model); those first calls must not be measured, and a slow
call after them (a CPU's first one-row forwards after a prefill) must not stand as a
shape's cost either."""

from __future__ import annotations

from typing import Any

import pytest

from engine import draft_costs
from engine.config import EngineConfig
from engine.draft_costs import CostModel
from engine.loader import load_model
from engine.sequence import SequenceState
from tests.conftest import TinyModels


class CompilingClock:
    """Time that moves only when the model forwards: 1 ms plus 0.1 ms a row, 3 s more the
    first time a row count is seen, and `slow` more on the calls numbered in `slow_calls`."""

    def __init__(self, slow_calls: tuple[int, ...] = (), slow: float = 0.0) -> None:
        self.now = 0.0
        self.seen: set[int] = set()
        self.calls = 0
        self.slow_calls, self.slow = slow_calls, slow

    def perf_counter(self) -> float:
        return self.now

    def forward(self, rows: int) -> None:
        self.now += 0.001 + 0.0001 * rows + (0.0 if rows in self.seen else 3.0)
        self.now += self.slow if self.calls in self.slow_calls else 0.0
        self.seen.add(rows)
        self.calls += 1


# the prefill's forward is call 0, six untimed one-row forwards 1-6, one untimed 2-row
# forward 7, then the 2-row shape's pairs (one row, two rows): 8-9, 10-11, 12-13
@pytest.mark.parametrize(
    "slow_calls", [(), (8,), (8, 9), (1, 2, 3)], ids=["steady", "one", "two", "warming"]
)
def test_calibration_measures_each_shape_after_its_first_call(
    tiny_models: TinyModels, monkeypatch: pytest.MonkeyPatch, slow_calls: tuple[int, ...]
) -> None:
    """Each shape's cost is its fastest timed forward beside the fastest one-row forwards
    timed between them: one or two slow forwards (a CPU's 3.7 ms beside a steady 2.3) and
    a slow warming one-row shape change no cost; an EMA of the timings kept a first slow
    one at 80% and put every verify ratio ~35% low."""
    clock = CompilingClock(slow_calls, slow=0.0005)
    monkeypatch.setattr(draft_costs, "time", clock)
    runner = load_model(tiny_models.gguf(qtype="F32")[0], EngineConfig(backend="numpy")).runner
    forward = runner.forward
    rows_seen: list[int] = []

    def timed_forward(token_ids: list[int], state: SequenceState, logits: str = "last") -> Any:
        clock.forward(len(token_ids))
        rows_seen.append(len(token_ids))
        return forward(token_ids, state, logits)

    runner.forward = timed_forward  # type: ignore[method-assign]
    costs = CostModel()
    costs.calibrate(runner)
    assert costs.step_seconds == pytest.approx(0.0011)
    for rows in (2, 4, 8, 16):
        assert costs.cost(rows) == pytest.approx(0.001 + 0.0001 * rows)
    assert rows_seen.count(16) == 4 and rows_seen.count(1) == 6 + 4 * 3


def test_where_steps_are_queued_the_ratios_are_against_a_queued_step(
    tiny_models: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On MLX plain steps are queued ahead of the host: the verify ratios calibrated against
    a synchronous step are rescaled to a queued one (the decode loop times plain steps
    queued), and a verify's absolute cost stays what was timed."""
    runner = load_model(tiny_models.gguf(qtype="F32")[0], EngineConfig(backend="mlx")).runner
    runner.fused = None
    state = runner.new_state()
    runner.forward([1] * 20, state)
    before = list(state.tokens)
    assert CostModel._queued_step(runner, state) > 0 and state.tokens == before  # taken back
    clock = CompilingClock()
    monkeypatch.setattr(draft_costs, "time", clock)
    forward = runner.forward

    def timed_forward(token_ids: list[int], state: SequenceState, logits: str = "last") -> Any:
        clock.forward(len(token_ids))
        return forward(token_ids, state, logits)

    runner.forward = timed_forward  # type: ignore[method-assign]
    monkeypatch.setattr(CostModel, "_queued_step", staticmethod(lambda runner, state: 0.00055))
    costs = CostModel()
    costs.calibrate(runner)
    assert costs.step_seconds == pytest.approx(0.00055)  # half the synchronous 1.1 ms
    for rows in (2, 4, 8, 16):
        assert costs.ratios[rows] == pytest.approx((0.001 + 0.0001 * rows) / 0.00055)
        assert costs.cost(rows) == pytest.approx(0.001 + 0.0001 * rows)
