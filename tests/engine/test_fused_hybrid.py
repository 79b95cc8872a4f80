"""A hybrid (Qwen3.5: Gated DeltaNet layers, gated attention with partial rotary
embeddings) through the one-launch step (engine/runner/fused_hybrid.py).

On any machine: which path the model takes and the shapes it is built for, and the tape
layout the engine reads back. On a CUDA GPU: the step against the plain forward in float32,
a verify's rows against single steps bit for bit in the default dtype, and a verify kept in
part (the tape replayed by the recurrent kernel) continuing exactly as single steps would.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from engine.config import EngineConfig
from engine.loader import load_model
from engine.runner import fused_hybrid
from engine.runner.fused_support import (
    model_shapes,
    rope_table,
    step_norms,
    step_unsupported_reason,
    unsupported_reason,
)
from kernels import fused_decode_cuda, fused_step_layers, gated_delta_cuda, step_knobs
from tests.engine.fused_steps import (
    assert_close_to_plain,
    assert_kept_verify_continues,
    single_steps,
)

PROMPT = list(range(3, 40))
LONG_PROMPT = [3 + (7 * i) % 90 for i in range(600)]  # attention split across blocks
STEPS = [5, 9, 33, 7, 3, 12, 40, 2, 17, 8]
needs_cuda = pytest.mark.skipif(not fused_decode_cuda.is_available(), reason="needs MLX on CUDA")


@pytest.fixture(scope="module")
def hybrid_gguf(tmp_path_factory):
    """bench.shapes' tiny Qwen3.5 as llama-quantize writes Q4_K_M: 2 key heads, 4 value heads
    (the converter's tiled order), three linear layers and one gated attention layer."""
    from bench.shapes import SHAPES
    from bench.shapes_gguf import write_gguf

    return write_gguf(SHAPES["tiny-qwen3.5"], tmp_path_factory.mktemp("hybrid") / "h.gguf")


def _load(path, **config):
    lm = load_model(path, EngineConfig(backend="mlx", **config))
    lm.runner.fused = None  # from the plain path (the loader may have taken the step)
    return lm


def test_the_one_launch_step_takes_the_hybrid(hybrid_gguf):
    lm = _load(hybrid_gguf)
    assert step_unsupported_reason(lm.model) is None
    assert "Gated DeltaNet ones in the one-launch step" in unsupported_reason(lm.model)
    shapes = model_shapes(lm.model)
    assert shapes.attn_gate and shapes.qk_norm and shapes.rope_dims == 16
    g = shapes.linear
    assert g is not None and g.layers == (0, 1, 2) and g.tiled
    assert (g.key_heads, g.value_heads, g.key_dim, g.value_dim, g.conv_kernel) == (2, 4, 64, 64, 4)
    # the tape row as the kernel writes it (fused_step_gdn.cuh) and the engine reads it back
    layout = fused_step_layers.tape_layout(shapes)
    assert [name for name, _ in layout] == ["q", "k", "v", "g", "beta", "conv_in"]
    assert sum(width for _, width in layout) == g.tape_row() == 4 * 64 * 3 + 8 + g.conv_channels
    names = fused_step_layers.state_inputs(shapes, 4)
    assert names == ["gconvw", "gvec", "k3", "v3", "cstack", "sstack"]
    # each linear layer's window and state in the stacks, in layer order (layer 3: attention)
    source = fused_step_layers.layer_source(shapes, 4)
    window, state = 3 * g.conv_channels, 4 * 64 * 64
    assert f"CONVS[L] = {{cstack + 0, cstack + {window}, cstack + {2 * window}, nullptr}}" in source
    assert f"SSMS[L] = {{sstack + 0, sstack + {state}, sstack + {2 * state}, nullptr}}" in source


def test_the_step_rotates_by_the_attention_layers_table(hybrid_gguf):
    """One table for every rotating layer: the attention layer's (layer 0 is linear and
    rotates nothing; its row of rope_tables is zeros)."""
    lm = _load(hybrid_gguf)
    shapes = model_shapes(lm.model)
    freqs = np.array(step_norms(lm.model, shapes)[3])
    assert not shapes.rope_per_layer and freqs.shape == (8,) and freqs.all()
    np.testing.assert_array_equal(freqs, rope_table(lm.model))
    np.testing.assert_allclose(freqs, 1e7 ** -(np.arange(0, 16, 2) / 16), rtol=1e-6)


def test_the_runner_takes_the_hybrid_step_unless_told_not_to(hybrid_gguf):
    """The runner takes the hybrid's step on CUDA unless told not to (EngineConfig.hybrid_step,
    BRANCHCHAT_HYBRID_STEP; engine/runner/runner.py's HYBRID_STEP: on since session 16's
    H200 run)."""
    from engine.runner import runner

    assert EngineConfig.from_environment({"BRANCHCHAT_HYBRID_STEP": "1"}).hybrid_step is True
    assert EngineConfig.from_environment({"BRANCHCHAT_HYBRID_STEP": "0"}).hybrid_step is False
    assert EngineConfig.from_environment({}).hybrid_step is None
    plain = load_model(hybrid_gguf, EngineConfig(backend="mlx"))
    assert (plain.runner.fused is not None) is (runner.HYBRID_STEP and runner_on_cuda())
    asked = load_model(hybrid_gguf, EngineConfig(backend="mlx", hybrid_step=True))
    assert (asked.runner.fused is not None) is runner_on_cuda()
    refused = load_model(hybrid_gguf, EngineConfig(backend="mlx", hybrid_step=False))
    assert refused.runner.fused is None


def runner_on_cuda() -> bool:
    return fused_decode_cuda.is_available()


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "long"])
def test_step_matches_the_plain_forward_in_float32(hybrid_gguf, prompt):
    lm = _load(hybrid_gguf, dtype="float32")
    plain, plain_state = single_steps(lm, STEPS, prompt)
    lm.runner.enable_fused_decode(mode="step")
    step, state = single_steps(lm, STEPS, prompt)
    assert lm.runner.last_path == "fused"
    assert_close_to_plain(plain, step)
    for mine, theirs in zip(state.layers, plain_state.layers, strict=True):
        if hasattr(mine, "ssm"):  # in_proj's rows: another summation order, float32
            np.testing.assert_allclose(np.array(mine.ssm), np.array(theirs.ssm), atol=1e-4)
            np.testing.assert_allclose(np.array(mine.conv), np.array(theirs.conv), atol=1e-4)


@needs_cuda
@pytest.mark.gpu
def test_a_steps_argmax_comes_from_its_own_evaluation(hybrid_gguf):
    """The step evaluates its logits' argmax with the launch (`MlxOps.remember_argmax`):
    a greedy read of those logits takes it, and it is their argmax, row by row."""
    lm = _load(hybrid_gguf)
    lm.runner.enable_fused_decode(mode="step")
    state = lm.runner.new_state()
    lm.runner.forward(PROMPT, state)
    for token_ids, mode in (([5], "last"), (STEPS[:4], "all")):
        logits = lm.runner.forward(token_ids, state, logits=mode)
        assert lm.runner.last_path == "fused" and lm.ops._argmax[0] is logits
        expected = np.argmax(np.array(logits), axis=-1)
        np.testing.assert_array_equal(lm.ops.argmax_rows(logits), expected)


@needs_cuda
@pytest.mark.gpu
def test_a_prefill_through_the_cuda_recurrence_matches_the_chunked_form(hybrid_gguf):
    """BRANCHCHAT_GDN_PREFILL=recurrent: a 600-token prefill's Gated DeltaNet rows through
    the CUDA kernel, row by row, give the chunked form's logits and states (float32: the
    two sum in other orders)."""
    from engine.sequence import prefill

    results = []
    for how in ("chunked", "recurrent"):
        lm = _load(hybrid_gguf, dtype="float32", gdn_prefill=how)
        assert lm.ops.gdn_prefill == how
        state = lm.runner.new_state()
        logits = np.array(lm.ops.to_numpy(prefill(lm.runner, state, LONG_PROMPT)))
        results.append((logits, state))
    (chunked, chunked_state), (recurrent, recurrent_state) = results
    np.testing.assert_allclose(recurrent, chunked, atol=1e-3)
    for mine, theirs in zip(recurrent_state.layers, chunked_state.layers, strict=True):
        if hasattr(mine, "ssm"):
            np.testing.assert_allclose(np.array(mine.ssm), np.array(theirs.ssm), atol=1e-4)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("pair,spread", [(1, 0), (2, 0), (2, 1)])  # gated_delta_cuda.PAIR
@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "long"])
def test_verify_rows_are_bit_identical_to_single_steps(
    hybrid_gguf, prompt, pair, spread, monkeypatch
):
    """What makes greedy speculation exact on a hybrid in the default dtype (PAIR: threads
    a value column; FQ_SPREAD: a verify's groups of rows dealt to warps of their own)."""
    monkeypatch.setattr(gated_delta_cuda, "PAIR", pair)
    monkeypatch.setitem(step_knobs.TUNING, "FQ_SPREAD", spread)
    lm = _load(hybrid_gguf)
    lm.runner.enable_fused_decode(mode="step")
    single, single_state = single_steps(lm, STEPS, prompt)
    state = lm.runner.new_state()
    lm.runner.forward(prompt, state)
    rows = np.array(lm.ops.to_numpy(lm.runner.forward(STEPS, state, logits="all")))
    for i in range(1, len(STEPS)):
        np.testing.assert_array_equal(rows[i - 1], single[i - 1][-1])
    for mine, theirs in zip(state.layers, single_state.layers, strict=True):
        if hasattr(mine, "ssm"):  # through float32, which holds a bfloat16 window exactly
            for a, b in ((mine.ssm, theirs.ssm), (mine.conv, theirs.conv)):
                np.testing.assert_array_equal(
                    np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32))
                )


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("pair", [1, 2])
@pytest.mark.parametrize("kept", [0, 1, 4, 7])
def test_a_verify_kept_in_part_continues_as_single_steps(hybrid_gguf, kept, pair, monkeypatch):
    """A verify's first `kept` rows kept (the linear layers' tapes replayed from the
    checkpoint by the recurrent kernel, with the step's PAIR), then decoding on: the logits
    of single steps over the same tokens, bit for bit."""
    monkeypatch.setattr(gated_delta_cuda, "PAIR", pair)
    lm = _load(hybrid_gguf)
    lm.runner.enable_fused_decode(mode="step")
    assert_kept_verify_continues(lm, PROMPT, STEPS[:7], STEPS[7:], kept)


def test_the_steps_outputs_become_each_layers_state_and_tape(hybrid_gguf):
    """gstate as the kernel lays it out (every layer's matrix state, then each layer's tape
    rows: q | k | v | g | beta | conv input) read back into the right layer and piece."""
    import mlx.core as mx

    lm = _load(hybrid_gguf)
    shapes = model_shapes(lm.model)
    g = shapes.linear
    state = lm.runner.new_state()
    recurrent = [layer for layer in state.layers if hasattr(layer, "ssm")]
    recurrent[1].start_tape()
    rows = 3
    floats = fused_step_layers.gstate_floats(shapes, rows)
    gstate = mx.arange(floats, dtype=mx.float32)
    gconv = mx.zeros((len(g.layers), g.conv_kernel - 1, g.conv_channels))
    fused_hybrid.adopt(shapes, recurrent, gstate, gconv, rows, 40)
    per_state = g.value_heads * g.key_dim * g.value_dim
    assert float(recurrent[2].ssm[0, 0, 0]) == 2 * per_state
    assert recurrent[1].ssm.shape == (g.value_heads, g.key_dim, g.value_dim)
    assert all(layer.length == 40 for layer in recurrent)
    assert recurrent[0].tape is None and recurrent[1].tape.num_rows() == rows
    tape = recurrent[1].tape
    # the rows stay in the step's output until a replay reads them (no slices built before)
    assert tape.pieces[0].made is None and tape.pieces[0].rows == rows
    row1 = fused_step_layers.state_floats(shapes) + rows * g.tape_row()  # layer 1's first row
    q, k, v, gg, beta = (np.array(x) for x in tape.qkvgb[0])
    assert q.shape == (rows, g.value_heads, g.key_dim) and q[0, 0, 0] == row1
    assert k[0, 0, 0] == row1 + g.value_heads * g.key_dim
    assert v.shape == (rows, g.value_heads, g.value_dim)
    assert (
        gg[1, 0]
        == row1 + g.tape_row() + 2 * g.value_heads * g.key_dim + g.value_heads * g.value_dim
    )
    assert beta[0, 0] == gg[0, 0] + g.value_heads
    conv_in = np.array(tape.conv_in[0])
    assert conv_in.shape == (rows, g.conv_channels) and conv_in[0, -1] == row1 + g.tape_row() - 1
    assert tape.pieces[0].made is not None and tape.pieces[0].make is None  # sliced once


def test_the_next_launch_reads_the_last_ones_stacks_while_every_layer_holds_them(hybrid_gguf):
    """Decoding on, the launch reads the last one's gconv and gstate as they are; once a
    layer holds another state (a rollback, a replay) it reads the layers' own, stacked."""
    lm = _load(hybrid_gguf)
    shapes = model_shapes(lm.model)
    g = shapes.linear
    state = lm.runner.new_state()
    recurrent = [layer for layer in state.layers if hasattr(layer, "ssm")]
    gstate = mx.arange(fused_step_layers.gstate_floats(shapes, 1), dtype=mx.float32)
    gconv = mx.arange(len(g.layers) * (g.conv_kernel - 1) * g.conv_channels, dtype=mx.float32)
    gconv = gconv.reshape(len(g.layers), g.conv_kernel - 1, g.conv_channels)
    stacks = fused_hybrid.adopt(shapes, recurrent, gstate, gconv, 1, 5)
    cstack, sstack = fused_hybrid.linear_inputs(recurrent, stacks)
    assert cstack is gconv and sstack is gstate
    replaced = recurrent[1].ssm + 1.0
    recurrent[1].ssm = replaced
    cstack, sstack = fused_hybrid.linear_inputs(recurrent, stacks)
    assert cstack is not gconv and sstack is not gstate
    np.testing.assert_array_equal(np.array(cstack), np.array(gconv))
    per_state = g.value_heads * g.key_dim * g.value_dim
    expected = np.array(gstate[: 3 * per_state])
    expected[per_state : 2 * per_state] += 1.0
    np.testing.assert_array_equal(np.array(sstack), expected)
    # another state's layers never read this one's stacks
    other = [layer for layer in lm.runner.new_state().layers if hasattr(layer, "ssm")]
    cstack, sstack = fused_hybrid.linear_inputs(other, stacks)
    assert not np.array(sstack).any() and sstack.shape == (3 * per_state,)
