"""Gemma 3 through the one-launch step: sliding-window layers attending through their KV
rings (the kernel writes a row into its slot in place; a recording verify tapes what it
overwrites), sandwich norms, GELU, scaled embeddings and attention, a rotation table a
layer.

On any machine: the path the model takes and the shapes and constants it is built for,
and the ring's bookkeeping around a kernel's rows against the plain forward's. On a CUDA
GPU: the step against the plain forward in float32 past the window and the ring's wrap, a
verify's rows against single steps bit for bit in the default dtype, and a verify kept in
part continuing as single steps would.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from engine.config import EngineConfig
from engine.errors import StateError
from engine.loader import load_model
from engine.runner.fused_support import (
    model_shapes,
    rope_tables,
    step_norms,
    step_unsupported_reason,
    unsupported_reason,
)
from engine.state import SlidingKV
from kernels import fused_decode_cuda, fused_step_layers, step_knobs
from kernels.ops_numpy import NumpyOps
from tests.engine.fused_steps import (
    assert_close_to_plain,
    assert_kept_verify_continues,
    single_steps,
)

# tests/oracles' Gemma 3 as llama-quantize writes Q4_K_M: 6 layers, the first five sliding
# over 8 positions, head_dim 32, vocabulary 320
FIXTURE = Path(__file__).parents[1] / "oracles" / "fixtures" / "gemma3_gguf" / "Q4_K_M.gguf"
PROMPT = list(range(3, 40))  # past the window
LONG_PROMPT = [3 + (7 * i) % 300 for i in range(200)]  # past the ring (8 + 64 rows), twice
STEPS = [5, 9, 33, 7, 3, 12, 40, 2, 17, 8]
needs_cuda = pytest.mark.skipif(not fused_decode_cuda.is_available(), reason="needs MLX on CUDA")


def _load(**config):
    lm = load_model(FIXTURE, EngineConfig(backend="mlx", **config))
    lm.runner.fused = None  # from the plain path (the loader may have taken the step)
    return lm


def _np(x):
    """A state's array as NumPy (bfloat16 rows through float32, which holds them exactly)."""
    return x if isinstance(x, np.ndarray) else np.array(x.astype(mx.float32))


def test_the_one_launch_step_takes_gemma3():
    lm = _load()
    assert step_unsupported_reason(lm.model) is None
    assert "sliding-window" in unsupported_reason(lm.model)  # not the five kernels
    s = model_shapes(lm.model)
    assert s.sliding == (0, 1, 2, 3, 4) and s.window == 8 and s.qk_norm
    assert s.sandwich and s.act == "gelu_tanh" and s.linear is None
    assert s.embed_scale == pytest.approx(16.0) and s.attn_scale == pytest.approx(32**-0.5)
    tables = rope_tables(lm.model)
    exponents = np.arange(0, 32, 2) / 32
    assert tables.shape == (6, 16) and tables.dtype == np.float32
    np.testing.assert_allclose(tables[:5], np.tile(1e4**-exponents, (5, 1)), rtol=1e-6)
    np.testing.assert_allclose(tables[5], 1e6**-exponents, rtol=1e-6)  # the global layer
    norms = step_norms(lm.model, s)  # nw1, nw2, nwf, freqs, q/k norms, the sandwich's
    np.testing.assert_array_equal(np.array(norms[3]), tables)
    for i, name in ((1, "pre_ffw_norm"), (6, "post_norm"), (7, "post_ffw_norm")):
        np.testing.assert_array_equal(  # through float32, which holds bfloat16 exactly
            np.array(norms[i][2].astype(mx.float32)),
            np.array(getattr(lm.model.layers[2], name).astype(mx.float32)),
        )
    source = fused_step_layers.layer_source(s, 6)
    assert "const int ring = k0_shape[1];" in source and "cap = k5_shape[1];" in source
    assert "SLD0 = 31ull" in source and "WINDOW = 8;" in source and "EMBED_SCALE = 16.0f" in source
    assert s.rope_per_layer and "ROPE_STRIDE = 16;" in source  # two bases: a table a layer


def test_the_runner_takes_gemma3s_step_unless_told_not_to():
    """The runner takes Gemma 3's step on CUDA unless told not to (EngineConfig.gemma_step,
    BRANCHCHAT_GEMMA_STEP; engine/runner/runner.py's GEMMA_STEP: on since session 16's H200
    run)."""
    from engine.runner import runner

    assert EngineConfig.from_environment({"BRANCHCHAT_GEMMA_STEP": "1"}).gemma_step is True
    assert EngineConfig.from_environment({"BRANCHCHAT_GEMMA_STEP": "0"}).gemma_step is False
    with pytest.raises(ValueError, match="BRANCHCHAT_GEMMA_STEP must be 0 or 1"):
        EngineConfig.from_environment({"BRANCHCHAT_GEMMA_STEP": "yes"})
    plain = load_model(FIXTURE, EngineConfig(backend="mlx"))
    on_cuda = fused_decode_cuda.is_available()
    assert (plain.runner.fused is not None) is (runner.GEMMA_STEP and on_cuda)
    asked = load_model(FIXTURE, EngineConfig(backend="mlx", gemma_step=True))
    assert (asked.runner.fused is not None) is on_cuda
    refused = load_model(FIXTURE, EngineConfig(backend="mlx", gemma_step=False))
    assert refused.runner.fused is None


HEADS, DIM, WINDOW, SLACK = 2, 4, 5, 3


def _rows(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((HEADS, n, DIM)).astype(np.float32)


def _kernel_writes(ring: SlidingKV, k: np.ndarray, v: np.ndarray) -> None:
    """What the step does to a ring: each row into its slot, in place, around the hooks."""
    start, n = ring.length, int(k.shape[1])
    ring.before_kernel_write(start, n)
    for j in range(n):
        ring.keys[:, (start + j) % ring.size] = k[:, j]
        ring.values[:, (start + j) % ring.size] = v[:, j]
    ring.after_kernel_write(start, n)


def _plain_writes(ring: SlidingKV, k: np.ndarray, v: np.ndarray) -> None:
    ring.append(k, v)
    ring.end_forward()


def _same(a: SlidingKV, b: SlidingKV) -> None:
    assert a.length == b.length and a.max_rollback() == b.max_rollback()
    np.testing.assert_array_equal(a.positions, b.positions)
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.values, b.values)


@pytest.mark.parametrize("chunks", [[1] * 20, [3, 2, 3, 1, 3, 3, 2], [2, 3] * 5])
def test_a_kernels_rows_keep_the_ring_as_the_plain_forward_does(chunks):
    """Positions, rows, cursor and rewind reach after each call; and a verify recorded over
    the last calls rebuilds the same ring at each of its positions (the snapshots due
    inside it) from either tape."""
    ops = NumpyOps(kv_dtype="float32")
    plain, kernel = (SlidingKV(ops, HEADS, DIM, WINDOW, SLACK) for _ in range(2))
    taped_from = len(chunks) - 3
    for i, n in enumerate(chunks):
        if i == taped_from:
            start = plain.length
            plain.start_tape()
            kernel.start_tape()
        k, v = _rows(2 * i, n), _rows(2 * i + 1, n)
        _plain_writes(plain, k, v)
        _kernel_writes(kernel, k, v)
        _same(plain, kernel)
    taped = plain.length - start
    assert plain.tape_covers(taped) and kernel.tape_covers(taped)
    assert plain.tape.overwritten.keys() == kernel.tape.overwritten.keys()
    stops = list(range(start + 1, plain.length + 1))
    for a, b in zip(
        plain.replay_verified(None, start, taped, stops)[0],
        kernel.replay_verified(None, start, taped, stops)[0],
        strict=True,
    ):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


def test_a_failed_kernel_forward_leaves_the_ring_shallower_not_wrong():
    """The slots a kernel overwrote hold rows of no position any more: after the failure the
    ring rewinds less far, and a rewind it still allows finds every row it needs."""
    ops = NumpyOps(kv_dtype="float32")
    ring = SlidingKV(ops, HEADS, DIM, WINDOW, SLACK)
    for i in range(12):
        _kernel_writes(ring, _rows(i, 1), _rows(100 + i, 1))
    reach = ring.max_rollback()
    point = ring.begin_forward()
    ring.before_kernel_write(point, 2)
    ring.keys[:, point % ring.size] = 7.0  # the kernel got this far, then the call failed
    assert ring.undo_forward(point) and ring.length == 12
    assert (ring.positions >= 0).sum() == ring.size - 2 and ring.max_rollback() < reach
    assert not (ring.positions >= 12).any()
    with pytest.raises(StateError, match="slack 3"):
        ring.before_kernel_write(ring.length, SLACK + 1)  # its queries would lose a key


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "long"])
def test_step_matches_the_plain_forward_in_float32(prompt):
    lm = _load(dtype="float32")
    plain, plain_state = single_steps(lm, STEPS, prompt)
    lm.runner.enable_fused_decode(mode="step")
    step, state = single_steps(lm, STEPS, prompt)
    assert lm.runner.last_path == "fused"
    assert_close_to_plain(plain, step)
    for mine, theirs in zip(state.layers, plain_state.layers, strict=True):
        a, b = mine.arrays(), theirs.arrays()
        if "pos" in a:  # a ring: the same slots hold the same positions
            np.testing.assert_array_equal(a["pos"], b["pos"])
        for key in ("k", "v"):  # float32 rows rounded to the KV dtype: an ulp apart at most
            np.testing.assert_allclose(_np(a[key]), _np(b[key]), rtol=2e-3, atol=1e-3)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("spread", [0, 1])  # FQ_SPREAD: a verify's row groups over warps
@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "long"])
def test_verify_rows_are_bit_identical_to_single_steps(prompt, spread, monkeypatch):
    """What makes greedy speculation exact on Gemma 3 in the default dtype."""
    monkeypatch.setitem(step_knobs.TUNING, "FQ_SPREAD", spread)
    lm = _load()
    lm.runner.enable_fused_decode(mode="step")
    single, single_state = single_steps(lm, STEPS[:8], prompt)
    state = lm.runner.new_state()
    lm.runner.forward(prompt, state)
    rows = np.array(lm.ops.to_numpy(lm.runner.forward(STEPS[:8], state, logits="all")))
    assert lm.runner.last_path == "fused"
    for i in range(1, 8):
        np.testing.assert_array_equal(rows[i - 1], single[i - 1][-1])
    for mine, theirs in zip(state.layers, single_state.layers, strict=True):
        a, b = mine.arrays(), theirs.arrays()
        for key in a:
            np.testing.assert_array_equal(_np(a[key]), _np(b[key]))


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("kept", [0, 1, 4, 7])
@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "long"])
def test_a_verify_kept_in_part_continues_as_single_steps(kept, prompt):
    """A verify's first `kept` rows kept (the rings rewound, or rebuilt from their tapes
    where a snapshot falls due inside the verify), then decoding on: the logits of single
    steps over the same tokens, bit for bit."""
    lm = _load()
    lm.runner.enable_fused_decode(mode="step")
    assert_kept_verify_continues(lm, prompt, STEPS[:7], STEPS[7:], kept)


def test_a_verify_carries_no_more_rows_than_the_rings_slack():
    """The runner's step row limit (a verify's drafts + 1) follows the rings' slack, so a
    verify stays on the step (bit for bit) however the snapshot policy is set."""
    from types import SimpleNamespace

    from engine.runner.fused import FusedDecode
    from kernels.fused_decode_cuda import MAX_ROWS

    gemma, llama = (SimpleNamespace(shapes=SimpleNamespace(sliding=s)) for s in ((0, 1), ()))
    assert FusedDecode.row_limit(gemma, 64) == MAX_ROWS
    assert FusedDecode.row_limit(gemma, 4) == 4 and FusedDecode.row_limit(gemma, 0) == 1
    assert FusedDecode.row_limit(llama, 0) == MAX_ROWS


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    """A Mistral whose every layer slides over 8 positions: a step of rings alone."""
    from tests.tiny_families import make_family_hf

    path = tmp_path_factory.mktemp("mistral") / "m"
    make_family_hf(path, "mistral", sliding_window=8)
    return path


def test_a_model_of_sliding_layers_alone_takes_the_step(mistral):
    lm = load_model(mistral, EngineConfig(backend="mlx"))
    assert step_unsupported_reason(lm.model) is None
    s = model_shapes(lm.model)
    assert s.sliding == tuple(range(lm.config.num_layers)) and s.window == 8
    assert not s.sandwich and s.act == "silu" and not s.rope_per_layer
    source = fused_step_layers.layer_source(s, lm.config.num_layers)
    assert "cap = k0_shape[1];" in source and "ring = k0_shape[1];" in source


@needs_cuda
@pytest.mark.gpu
def test_a_model_of_sliding_layers_alone_matches_the_plain_forward(mistral):
    lm = load_model(mistral, EngineConfig(backend="mlx", dtype="float32"))
    lm.runner.fused = None
    plain, _ = single_steps(lm, STEPS, LONG_PROMPT)
    lm.runner.enable_fused_decode(mode="step")
    step, _ = single_steps(lm, STEPS, LONG_PROMPT)
    assert lm.runner.last_path == "fused"
    assert_close_to_plain(plain, step)
