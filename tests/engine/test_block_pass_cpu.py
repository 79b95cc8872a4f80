"""The block drafter's pass as one C call (engine/block_pass_cpu.py): the logits and drafts
of the pass run op by op, over contexts that outgrow the caches, after a cut that leaves
stale rows past the cursor, and on a context that starts past position 0 (the rope
tables from `base`); speculation with it never changes the output; the engine takes it
on NumPy unless BRANCHCHAT_DRAFTER_COMPILE=0."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.block_drafter import BlockDrafter
from engine.block_pass_cpu import CpuPass, unsupported_reason
from engine.default_model import is_default_model_present
from engine.drafter_file import BlockDrafterWeights
from engine.runner import cpu_step
from engine.sampling import SamplingSettings
from tests.block_drafters import write_drafter
from tests.engine import test_speculative
from tests.engine.test_block_drafter import (
    SIGNATURE,
    assert_speculation_exact,
    fresh_rows,
    greedy_and_sampled,
)
from tests.engine.test_speculative import Case, Pair, RandomK

pair = test_speculative.pair
cases = test_speculative.cases
random_k = test_speculative.random_k

# float32 both ways, summed in other orders: measured within 1.8e-4 of logits up to ~5;
# the same pass over a context one row short misses by tenths
ATOL = 1e-3


@pytest.fixture
def numpy_pair(pair: Pair) -> Pair:
    if pair.backend != "numpy" or cpu_step.extension() is None:
        pytest.skip("the C step is the NumPy backend's")
    return pair


def drafters(target: Any, tmp_path: Path, **kwargs: Any) -> tuple[BlockDrafter, BlockDrafter]:
    """The same file's drafter op by op and through the C step."""
    path = write_drafter(tmp_path / "drafter.safetensors", target.config, SIGNATURE, **kwargs)
    weights = BlockDrafterWeights(path, target.model, SIGNATURE)
    assert unsupported_reason(weights, target.ops) is None
    fast = BlockDrafter(weights, target.model, False, CpuPass(weights, target.ops))
    return BlockDrafter(weights, target.model), fast


def feed(drafter: BlockDrafter, tokens: list[int], rows: np.ndarray, start: int = 0) -> None:
    drafter.begin(tokens)
    drafter.observe_hidden(rows[start:], start)


def assert_same_pass(a: BlockDrafter, b: BlockDrafter, k: int, what: str) -> None:
    np.testing.assert_allclose(b._logit_rows(11, k), a._logit_rows(11, k), atol=ATOL, err_msg=what)
    da, db = a.propose(11, k), b.propose(11, k)
    assert da.tokens == db.tokens, what
    np.testing.assert_allclose(da.confidence, db.confidence, rtol=1e-3, atol=1e-6)


def test_the_c_pass_drafts_as_the_pass_op_by_op(numpy_pair: Pair, tmp_path: Path) -> None:
    target = numpy_pair.target
    eager, fast = drafters(target, tmp_path, layers=2, block=9, vocab=40, seed=2)
    tokens = [3 + (i * 7) % 90 for i in range(300)]  # past FullKV's first capacity
    rows = fresh_rows(target, tokens)
    for end in (5, 40, 130, 300):
        for d in (eager, fast):
            feed(d, tokens[:end], rows[:end])
        for k in (1, 4, 8):
            assert_same_pass(eager, fast, k, f"context {end}, k {k}")
    # a cut to an earlier point leaves later rows (the block's too) past the cursor
    for d in (eager, fast):
        feed(d, tokens[:60], rows[:60])
    assert_same_pass(eager, fast, 8, "after a cut")
    # a context whose rows start at position 37: rotated from the tables' row 37 on
    for d in (eager, fast):
        feed(d, [], rows)  # forget everything first
        feed(d, tokens[:90], rows[:90], start=37)
        assert d.base == 37
    assert_same_pass(eager, fast, 8, "a context from position 37")
    one_short = eager._logit_rows(11, 8)
    feed(eager, tokens[:89], rows[:89], start=37)
    assert np.abs(eager._logit_rows(11, 8) - one_short).max() > 10 * ATOL  # the bound bites


@greedy_and_sampled
def test_speculation_with_the_c_pass_never_changes_the_output(
    numpy_pair: Pair,
    cases: list[Case],
    random_k: RandomK,
    tmp_path: Path,
    settings: SamplingSettings,
) -> None:
    target = numpy_pair.target
    fast = drafters(target, tmp_path, block=9)[1]
    assert_speculation_exact(target, fast, cases[:3], random_k, settings)


@pytest.mark.real_model
@pytest.mark.skipif(not is_default_model_present(), reason="the default model is not fetched")
def test_the_engine_runs_the_pass_through_the_c_step_on_numpy() -> None:
    from engine.config import EngineConfig
    from engine.default_model import default_model_path
    from engine.loader import load_model
    from engine.session import Session

    config = EngineConfig(backend="numpy")
    loaded = load_model(default_model_path(), config)
    first, second = (Session(loaded, config=config).block_drafter for _ in range(2))
    assert first is not None and second is not None
    assert first.cpu_pass is not None and second.cpu_pass is first.cpu_pass  # one plan
    off = Session(loaded, config=dataclasses.replace(config, drafter_compile=False))
    assert off.block_drafter is not None and off.block_drafter.cpu_pass is None
    tokens = list(range(200, 260))
    rows = np.random.default_rng(0).standard_normal((60, 576)).astype(np.float32)
    for d in (first, off.block_drafter):
        feed(d, tokens, rows)
    assert first.propose(7, 8).tokens == off.block_drafter.propose(7, 8).tokens
