"""A queued one-launch step's status check (engine/runner/ahead.py, `Launch._check`): a
sampled step is read twice (its token, then its pack), and the second read waits for
nothing; a step whose barrier timed out raises at every read."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from engine.runner import ahead
from engine.runner.ahead import Kept, Launch, StepTimedOut


def _launch(status: int) -> Launch:
    top = mx.array([7], dtype=mx.uint32)
    packed = mx.arange(5, dtype=mx.float32)
    state: Any = None  # never touched by reads
    return Launch(state, top, mx.array([status], dtype=mx.uint32), Kept(None, packed))


def test_a_good_step_is_waited_for_once(monkeypatch):
    evals: list[tuple[Any, ...]] = []
    real = mx.eval

    def counted(*arrays: Any) -> None:
        evals.append(arrays)
        real(*arrays)

    monkeypatch.setattr(ahead.mx, "eval", counted)
    step = _launch(0)
    assert step.read() == 7
    np.testing.assert_array_equal(step.read_pack(), np.arange(5, dtype=np.float32))
    assert step.read() == 7
    assert len(evals) == 1 and step.is_checked


def test_a_timed_out_step_raises_at_every_read():
    step = _launch(1)
    for read in (step.read, step.read_pack, step.read):
        with pytest.raises(StepTimedOut):
            read()
    assert not step.is_checked
