"""The block drafter's pass in one call: traced with mx.compile on MLX
(engine/block_pass_mlx.py), the C step on NumPy (engine/block_pass_cpu.py). Each gives the
drafts and logits of the pass run op by op, over contexts that outgrow their buffers,
after a cut that leaves stale rows in them, and on a context that starts past position 0;
the engine takes it unless BRANCHCHAT_DRAFTER_COMPILE=0. Speculation with it never
changes the output (tests/engine/test_block_drafter.py). The traced pass runs on the CPU's
MLX here and on the GPU on the lent machine."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import block_pass_cpu
from engine.block_drafter import BlockDrafter, confidence
from engine.block_pass_cpu import CpuPass
from engine.block_pass_mlx import CompiledPass
from engine.default_model import is_default_model_present
from engine.drafter_file import BlockDrafterWeights
from tests.block_drafters import write_drafter
from tests.engine import test_speculative
from tests.engine.test_block_drafter import SIGNATURE, fresh_rows
from tests.engine.test_speculative import Pair
from tests.tolerances import assert_logits_close, compute_dtype

pair = test_speculative.pair
cases = test_speculative.cases
random_k = test_speculative.random_k

# the C pass against op by op, float32 both, summed in other orders: measured within
# 1.8e-4 of logits up to ~5; the same pass over a context one row short misses by tenths
C_ATOL = 1e-3


@pytest.fixture
def mlx_pair(pair: Pair) -> Pair:
    if pair.backend != "mlx":
        pytest.skip("the traced pass is MLX's")
    return pair


def drafters(target: Any, tmp_path: Path, **kwargs: Any) -> tuple[BlockDrafter, BlockDrafter]:
    """The same file's drafter op by op and in one call (traced on MLX, C on NumPy)."""
    path = write_drafter(tmp_path / "drafter.safetensors", target.config, SIGNATURE, **kwargs)
    weights = BlockDrafterWeights(path, target.model, SIGNATURE)
    eager = BlockDrafter(weights, target.model)
    if target.ops.name == "mlx":
        fast = BlockDrafter(weights, target.model, True)
        assert eager.compiled is None and fast.compiled is not None
        return eager, fast
    reason = block_pass_cpu.unsupported_reason(weights, target.ops)
    if reason:
        pytest.skip(reason)
    return eager, BlockDrafter(weights, target.model, False, CpuPass(weights, target.ops))


def feed(drafter: BlockDrafter, tokens: list[int], rows: np.ndarray, start: int = 0) -> None:
    drafter.begin(tokens)
    drafter.observe_hidden(rows[start:], start)


def assert_same_pass(a: BlockDrafter, b: BlockDrafter, k: int, what: str) -> None:
    """The two drafters' block logits within the pass's bound; in float32 the same drafts
    and confidences too (in bfloat16 a near tie may fall either way)."""
    dtype = compute_dtype(a.ops)
    rows_a, rows_b = a._logit_rows(11, k), b._logit_rows(11, k)
    if b.cpu_pass is not None:
        np.testing.assert_allclose(rows_b, rows_a, atol=C_ATOL, err_msg=what)
    else:
        assert_logits_close(rows_b, rows_a, dtype, a.w.shape.hidden, what)
    if dtype == "float32":
        da, db = a.propose(11, k), b.propose(11, k)
        assert da.tokens == db.tokens, what
        np.testing.assert_allclose(da.confidence, db.confidence, rtol=1e-3, atol=1e-6)


def test_the_pass_in_one_call_drafts_as_the_pass_op_by_op(pair: Pair, tmp_path: Path) -> None:
    target = pair.target
    eager, fast = drafters(target, tmp_path, layers=2, block=9, vocab=40, seed=2)
    tokens = [3 + (i * 7) % 90 for i in range(300)]  # past FullKV's first capacity
    rows = fresh_rows(target, tokens)
    capacities = set()
    for end in (5, 40, 130, 300):  # growing contexts: new buffer capacities, new traces
        for d in (eager, fast):
            feed(d, tokens[:end], rows[:end])
        for k in (1, 4, 8):
            assert_same_pass(eager, fast, k, f"context {end}, k {k}")
        capacities.add(fast.kv[0].capacity())
    assert len(capacities) > 1
    # a cut to an earlier point leaves later rows (a C pass's block rows too) in the
    # buffers past the cursor: masked, never read
    for d in (eager, fast):
        feed(d, tokens[:60], rows[:60])
    assert fast.kv[0].capacity() > 60
    assert_same_pass(eager, fast, 8, "after a cut")
    (tmp_path / "fresh").mkdir()
    fresh = drafters(target, tmp_path / "fresh", layers=2, block=9, vocab=40, seed=2)[1]
    feed(fresh, tokens[:60], rows[:60])
    assert_same_pass(fresh, fast, 8, "after a cut, against a fresh drafter")
    # a context whose rows start at position 37: rotated at their slots from 0 on
    for d in (eager, fast):
        feed(d, [], rows)  # forget everything first
        feed(d, tokens[:90], rows[:90], start=37)
        assert d.base == 37
    assert_same_pass(eager, fast, 8, "a context from position 37")
    one_row_more = fast._logit_rows(11, 8)
    feed(fast, tokens[:89], rows[:89], start=37)
    assert np.abs(fast._logit_rows(11, 8) - one_row_more).max() > 10 * C_ATOL  # bounds bite


def test_a_sampled_draft_reads_the_traced_rows(mlx_pair: Pair, tmp_path: Path) -> None:
    target = mlx_pair.target
    eager, traced = drafters(target, tmp_path, block=9, vocab=40, seed=4)
    tokens = list(range(3, 50))
    rows = fresh_rows(target, tokens)
    seen: dict[str, list[np.ndarray]] = {"eager": [], "traced": []}
    for name, d in (("eager", eager), ("traced", traced)):
        feed(d, tokens, rows)
        d.couple(lambda row, history, name=name: seen[name].append(row) or int(np.argmax(row)))
        draft = d.propose(11, 6)
        assert len(draft.tokens) == 6
    want = np.array(seen["eager"])
    got = np.array(seen["traced"])
    finite = np.isfinite(want)
    assert (finite == np.isfinite(got)).all()
    block, got_block = want[finite].reshape(6, -1), got[finite].reshape(6, -1)
    assert_logits_close(got_block, block, compute_dtype(eager.ops), eager.w.shape.hidden)
    np.testing.assert_allclose(traced.propose(11, 6).confidence, confidence(got_block), rtol=1e-4)


@pytest.mark.real_model
@pytest.mark.skipif(not is_default_model_present(), reason="the default model is not fetched")
def test_the_engine_traces_the_pass_on_a_gpu_only() -> None:
    """On MLX's CPU a pass is bound by its products (the traced whole block would cost
    more than k + 1 rows op by op); on a GPU it is overhead, and traced by default."""
    import mlx.core as mx

    from engine.config import EngineConfig
    from engine.default_model import default_model_path
    from engine.loader import load_model
    from engine.session import Session

    config = EngineConfig(backend="mlx")
    loaded = load_model(default_model_path(), config)
    traced = Session(loaded, config=config).block_drafter
    assert traced is not None
    assert (traced.compiled is not None) == (mx.default_device() == mx.gpu)
    off = Session(loaded, config=dataclasses.replace(config, drafter_compile=False))
    assert off.block_drafter is not None and off.block_drafter.compiled is None


@pytest.mark.real_model
@pytest.mark.skipif(not is_default_model_present(), reason="the default model is not fetched")
def test_sessions_share_one_traced_pass_warmed_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the pass is traced (a GPU; here the CPU's MLX told it is one), the first
    session's load traces it on a made-up context and leaves the drafter empty; later
    sessions on the model take the same traced pass; drafts are the op-by-op pass's."""
    from engine import block_drafter_load
    from engine.config import EngineConfig
    from engine.default_model import default_model_path
    from engine.loader import load_model
    from engine.session import Session

    traced_calls: list[int] = []
    original = CompiledPass.greedy

    def counted(self: CompiledPass, *args: Any) -> Any:
        traced_calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(block_drafter_load, "on_gpu", lambda ops: True)
    # the traced pass under test: on a CUDA GPU the one-launch pass would take its place
    # (warmed instead, the traced one kept for a timed-out launch)
    monkeypatch.setattr(
        block_drafter_load.block_pass_fused, "unsupported_reason", lambda *_: "traced under test"
    )
    monkeypatch.setattr(CompiledPass, "greedy", counted)
    config = EngineConfig(backend="mlx", dtype="float32")  # drafts compared token for token
    loaded = load_model(default_model_path(), config)
    first = Session(loaded, config=config).block_drafter
    assert first is not None and first.compiled is not None
    assert traced_calls == [1]  # the warm-up's greedy draft
    assert first.cursor == 0 and first.tokens == []
    second = Session(loaded, config=config).block_drafter
    assert second is not None and second.compiled is first.compiled
    assert traced_calls == [1]  # no second warm-up
    eager = Session(loaded, config=dataclasses.replace(config, drafter_compile=False))
    assert eager.block_drafter is not None and eager.block_drafter.compiled is None
    assert_same_drafts(second, eager.block_drafter)


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
    assert_same_drafts(first, off.block_drafter)


def assert_same_drafts(a: BlockDrafter, b: BlockDrafter) -> None:
    """The default model's drafters draft alike over a made-up 60-row context."""
    tokens = list(range(200, 260))
    rows = np.random.default_rng(0).standard_normal((60, 576)).astype(np.float32)
    for d in (a, b):
        feed(d, tokens, rows)
    assert a.propose(7, 8).tokens == b.propose(7, 8).tokens
