"""The block drafter's pass as one launch of the step kernel (engine/block_pass_fused.py).

Everywhere: the drafter's weight table holds its layers, its head and the embedding table
of the target's rows with the mask row after them, each row read back as the kernel reads
it; the drafter takes the fused pass for every context (one from position 37 too), and a
launch whose barrier timed out leaves the traced pass drafting, for good. On CUDA (the lent
machine): its drafts and logits are the op-by-op pass's over contexts that outgrow their
buffers and after a cut, and the engine takes it for the default model's drafter."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from engine import block_pass_fused
from engine.block_drafter import BlockDrafter
from engine.block_pass_fused import PassTimedOut, drafter_step
from engine.config import EngineConfig
from engine.default_model import is_default_model_present
from engine.drafter_file import BlockDrafterWeights
from engine.loader import load_model
from kernels import fused_decode_cuda
from kernels.quantized import QuantizedWeight, dequantize
from tests.block_drafters import write_drafter
from tests.conftest import TinyModels
from tests.engine.test_block_drafter import SIGNATURE, fresh_rows
from tests.engine.test_block_pass import assert_same_pass, feed
from tests.kernels.test_step_weights import read_row
from tests.tolerances import assert_logits_close, compute_dtype

on_cuda = pytest.mark.skipif(not fused_decode_cuda.is_available(), reason="CUDA only")


@pytest.fixture(scope="module", params=["F32", "Q8_0"])
def target(request: pytest.FixtureRequest, tiny_models: TinyModels) -> Any:
    """A tiny Llama on MLX, dense or with a quantized embedding (the table's first part)."""
    path = tiny_models.gguf(qtype=request.param, seed=0)[0]
    return load_model(path, EngineConfig(backend="mlx")).runner


def weights_for(target: Any, tmp_path: Path, **kwargs: Any) -> BlockDrafterWeights:
    path = write_drafter(tmp_path / "drafter.safetensors", target.config, SIGNATURE, **kwargs)
    return BlockDrafterWeights(path, target.model, SIGNATURE)


def _f32(a: Any) -> np.ndarray:
    return np.array(mx.array(a).astype(mx.float32))


def test_the_table_holds_the_drafter_as_a_decoder(target: Any, tmp_path: Path) -> None:
    w = weights_for(target, tmp_path, layers=2, block=9, vocab=40, seed=3)
    table, shapes, norms = drafter_step(w, target.model)
    D, V = w.shape.hidden, target.config.vocab_size
    assert shapes.vocab == 40 and shapes.hidden == D and shapes.heads == w.shape.heads
    for i, layer in enumerate(w.layers):
        qkv = np.concatenate([_f32(layer["q_proj"]), _f32(layer["kv_proj"])])
        mats = [qkv, _f32(layer["o_proj"]), _f32(layer["gate_up"]), _f32(layer["down_proj"])]
        for j, want in enumerate(mats):
            for row in (0, len(want) // 2, len(want) - 1):
                cols = want.shape[1]
                np.testing.assert_array_equal(read_row(table, 4 * i + j, row, cols), want[row])
        np.testing.assert_array_equal(np.array(norms[0][i]), _f32(layer["input_norm"]))
        np.testing.assert_array_equal(np.array(norms[1][i]), _f32(layer["post_norm"]))
    head, L = _f32(w.head), w.shape.layers
    for row in (0, 17, 39):
        np.testing.assert_array_equal(read_row(table, 4 * L, row, D), head[row])
    # the embedding table: the target's rows as the table was given them (as loaded, where
    # the backend still keeps that), then the mask row at id V
    embed = getattr(target.ops, "stored", lambda w: w)(target.model.embed)
    table_rows = dequantize(embed) if isinstance(embed, QuantizedWeight) else _f32(embed)
    for token in (0, 5, V - 1):
        np.testing.assert_array_equal(read_row(table, 4 * L + 1, token, D), table_rows[token])
    np.testing.assert_array_equal(read_row(table, 4 * L + 1, V, D), _f32(w.mask_embedding)[0])
    inv = 1.0 / w.shape.rope_base ** (np.arange(0, w.shape.head_dim, 2) / w.shape.head_dim)
    np.testing.assert_allclose(np.array(norms[3]), inv, rtol=1e-7)
    if not fused_decode_cuda.is_available():
        assert block_pass_fused.unsupported_reason(w, target.model) == (
            "the fused step runs on CUDA only"
        )


class StandIn:
    """A fused pass that answers with an op-by-op drafter's rows (`eager`, fed the same
    context) and counts its calls; `fail`: its launch times out instead."""

    def __init__(self, eager: BlockDrafter, fail: bool = False) -> None:
        self.eager, self.fail, self.calls = eager, fail, 0

    def greedy(self, pending: int, kv: list[Any], k: int) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        if self.fail:
            raise PassTimedOut("a barrier timed out")
        assert kv[0].length == self.eager.cursor - self.eager.base  # queued rows projected
        return self.eager.ops.top1_rows(self.eager.block_logits(pending, k))

    def logits(self, pending: int, kv: list[Any], k: int) -> Any:
        self.calls += 1
        if self.fail:
            raise PassTimedOut("a barrier timed out")
        return self.eager.block_logits(pending, k)


def test_the_drafter_drafts_through_its_fused_pass(
    target: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = weights_for(target, tmp_path, layers=2, block=9, vocab=40, seed=2)
    eager, traced = BlockDrafter(w, target.model), BlockDrafter(w, target.model, True)
    stand_in = StandIn(BlockDrafter(w, target.model))
    fused = BlockDrafter(w, target.model, traced.compiled, fused=stand_in)  # type: ignore[arg-type]
    tokens = [3 + (i * 7) % 90 for i in range(120)]
    rows = fresh_rows(target, tokens)
    for d in (eager, fused, stand_in.eager):
        feed(d, tokens[:80], rows[:80])
    assert fused.propose(11, 6).tokens == stand_in.eager.propose(11, 6).tokens
    assert stand_in.calls == 1
    fused.couple(lambda row, history: int(np.argmax(row)))
    assert len(fused.propose(11, 4).tokens) == 4 and stand_in.calls == 2
    fused.couple(None)
    # a context from position 37 (rows rotated at their slots): the fused pass too
    for d in (eager, fused, stand_in.eager):
        feed(d, [], rows)
        feed(d, tokens[:90], rows[:90], start=37)
        assert d.base == 37
    assert_same_pass(eager, fused, 8, "a context from position 37")
    # its logits, and in float32 its drafts too (assert_same_pass compares those there only)
    assert stand_in.calls == 3 + (compute_dtype(fused.ops) == "float32")
    # a launch that timed out: the traced pass from then on, said in the log
    failing = StandIn(stand_in.eager, fail=True)
    dropped = BlockDrafter(w, target.model, traced.compiled, fused=failing)  # type: ignore[arg-type]
    fresh = BlockDrafter(w, target.model)
    for d in (dropped, fresh):
        feed(d, tokens[:80], rows[:80])
    with caplog.at_level(logging.WARNING):
        assert_same_pass(fresh, dropped, 6, "after a timed-out launch")
    assert dropped.fused is None and failing.calls == 1
    assert "timed out at a grid barrier" in caplog.text


@on_cuda
def test_the_one_launch_pass_drafts_as_the_pass_op_by_op(target: Any, tmp_path: Path) -> None:
    w = weights_for(target, tmp_path, layers=2, block=9, vocab=40, seed=2)
    eager = BlockDrafter(w, target.model)
    fast = BlockDrafter(w, target.model, True, fused=block_pass_fused.FusedPass(w, target.model))
    tokens = [3 + (i * 7) % 90 for i in range(300)]
    rows = fresh_rows(target, tokens)
    for end in (5, 40, 130, 300):  # growing contexts: new buffer capacities
        for d in (eager, fast):
            feed(d, tokens[:end], rows[:end])
        for k in (1, 4, 8):
            assert_same_pass(eager, fast, k, f"context {end}, k {k}")
    for d in (eager, fast):  # a cut: the block's rows written past the cursor stay unread
        feed(d, tokens[:60], rows[:60])
    assert_same_pass(eager, fast, 8, "after a cut")
    one_row_more = fast._logit_rows(11, 8)
    feed(fast, tokens[:59], rows[:59])
    feed(eager, tokens[:59], rows[:59])
    assert_same_pass(eager, fast, 8, "one row fewer")
    assert np.abs(fast._logit_rows(11, 8) - one_row_more).max() > 1e-2  # the bound bites
    for d in (eager, fast):  # a context from position 37: rows rotated at their slots
        feed(d, [], rows)
        feed(d, tokens[:90], rows[:90], start=37)
        assert d.base == 37
    assert_same_pass(eager, fast, 8, "a context from position 37")


@on_cuda
@pytest.mark.real_model
@pytest.mark.skipif(not is_default_model_present(), reason="the default model is not fetched")
def test_the_engine_drafts_in_one_launch_on_cuda() -> None:
    from engine.config import EngineConfig
    from engine.default_model import default_model_path
    from engine.loader import load_model
    from engine.session import Session

    config = EngineConfig(backend="mlx")
    loaded = load_model(default_model_path(), config)
    drafter = Session(loaded, config=config).block_drafter
    assert drafter is not None and drafter.fused is not None and drafter.compiled is not None
    again = Session(loaded, config=config).block_drafter
    assert again is not None and again.fused is drafter.fused  # one per file version


def test_rows_rotated_at_their_slots_draft_as_at_their_positions(
    target: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A context from position 37 is rotated at its slots 0.. (the fused pass's position
    is its cache row); under RoPE a score depends on the difference of positions alone,
    so the block's logits are those of the rows rotated at their positions, to rounding."""
    w = weights_for(target, tmp_path, layers=2, block=9, vocab=40, seed=5)
    tokens = [3 + (i * 5) % 90 for i in range(120)]
    rows = fresh_rows(target, tokens)
    slots, positions = BlockDrafter(w, target.model), BlockDrafter(w, target.model)
    rotate = BlockDrafter._rope
    monkeypatch.setattr(positions, "_rope", lambda x, offset: rotate(positions, x, offset + 37))
    for d in (slots, positions):
        feed(d, tokens[:120], rows[:120], start=37)
    want = positions.block_logits(11, 8)
    got = slots.block_logits(11, 8)
    assert_logits_close(got, want, compute_dtype(target.ops), w.shape.hidden)
    assert slots.propose(11, 8).tokens == positions.propose(11, 8).tokens
    # the bound bites: the context one row shorter scores other rows
    feed(positions, [], rows)
    feed(positions, tokens[:120], rows[:120], start=38)
    off = np.asarray(target.ops.to_numpy(positions.block_logits(11, 8)))
    assert np.abs(off - np.asarray(target.ops.to_numpy(want))).max() > 1e-2
