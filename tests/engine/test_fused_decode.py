"""The fused decode path (engine/runner/fused.py) against the plain MLX forward.

On a CPU the kernels are the MLX-ops reference (kernels/fused_decode_ref.py), which
checks the plumbing: KV rows in the state's own buffers, positions, logits modes,
compiled and eager steps, buffer growth, rollback. On a CUDA GPU the same tests run the
real kernels, and the row-invariance test checks the property speculation relies on:
a k-row verify's logits equal k one-row steps bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.loader import load_model
from engine.runner import ModelRunner, fused, fused_decode_for
from engine.runner.fused import unsupported_reason
from kernels import fused_decode_cuda, step_knobs

PROMPT = list(range(3, 40))
# (mode, compiled): the five-kernel path eager and traced; on CUDA also the one-launch step
VARIANTS = [("layers", False), ("layers", True)] + (
    [("step", True)] if fused_decode_cuda.is_available() else []
)
STEPS = [5, 9, 33, 7, 3, 12, 40, 2, 17, 8]
# past 512 keys: the one-launch kernel splits attention across blocks and combines them
LONG_PROMPT = [3 + (7 * i) % 90 for i in range(600)]


@pytest.fixture(params=["q4_gguf", "f32_hf"])
def mlx_llama(request, tiny_models):
    if request.param == "q4_gguf":
        path, _ = tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")
    else:
        path, _ = tiny_models.hf("llama")
    lm = load_model(path, EngineConfig(backend="mlx"))
    lm.runner.fused = None  # the loader may have enabled it (CUDA): start from the plain path
    return lm


def _steps(lm, steps, prompt=PROMPT):
    state = lm.runner.new_state()
    lm.runner.forward(prompt, state)
    return [np.array(lm.ops.to_numpy(lm.runner.forward([t], state))) for t in steps], state


def _tolerance(lm):
    import mlx.core as mx

    return 2e-4 if lm.ops.dtype == mx.float32 else 0.15


def _relative_l2(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def assert_verify_equals_steps(lm, single, prompt, steps=STEPS):
    """A verify of `steps` after `prompt` gives each row the bits of the single steps'
    logits `single` (from _steps over the same prompt and steps)."""
    state = lm.runner.new_state()
    lm.runner.forward(prompt, state)
    rows = np.array(lm.ops.to_numpy(lm.runner.forward(steps, state, logits="all")))
    for i in range(1, len(steps)):
        np.testing.assert_array_equal(rows[i - 1], single[i - 1][-1])


def _assert_close_logits(lm, got, want):
    """float32: element-wise. bfloat16: the plain MLX path rounds its activations and
    attention its own way, a gap that grows with the context (on the H200, 3.2% relative
    L2 after 600 tokens, the same for both fused paths): there the logits must agree to
    6%, where a wrong attention or combine misses by tens of percent."""
    import mlx.core as mx

    if lm.ops.dtype == mx.float32:
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)
    else:
        assert _relative_l2(got, want) <= 0.06


@pytest.mark.parametrize("mode,compiled", VARIANTS)
@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "long"])
def test_fused_steps_match_plain_forward(mlx_llama, mode, compiled, prompt, monkeypatch):
    monkeypatch.setattr(fused, "_CAPACITY_STEP", 16)  # grow (and retrace) mid-run
    plain, plain_state = _steps(mlx_llama, STEPS, prompt)
    mlx_llama.runner.enable_fused_decode(compiled=compiled, mode=mode)
    fast, state = _steps(mlx_llama, STEPS, prompt)
    for a, b in zip(plain, fast, strict=True):
        _assert_close_logits(mlx_llama, b, a)
    assert state.tokens == plain_state.tokens
    assert state.layers[0].capacity() % 16 == 0 and state.layers[0].length == state.offset


@pytest.mark.parametrize("mode,compiled", VARIANTS)
def test_fused_verify_rows_and_rollback(mlx_llama, mode, compiled):
    """A multi-row call gives every row's logits; rolling back and decoding again agrees."""
    runner = mlx_llama.runner
    plain, _ = _steps(mlx_llama, STEPS[:6])
    runner.enable_fused_decode(compiled=compiled, mode=mode)
    state = runner.new_state()
    runner.forward(PROMPT, state)
    first = np.array(mlx_llama.ops.to_numpy(runner.forward([STEPS[0]], state)))
    cp = state.checkpoint(record=True)
    rows = np.array(mlx_llama.ops.to_numpy(runner.forward(STEPS[1:6], state, logits="all")))
    assert rows.shape[0] == 5
    for i in range(5):
        np.testing.assert_allclose(rows[i], plain[i + 1][-1], atol=_tolerance(mlx_llama))
    state.rollback_retaining(cp, 2)
    again = np.array(mlx_llama.ops.to_numpy(runner.forward([STEPS[3]], state)))
    assert state.tokens[-3:] == [STEPS[1], STEPS[2], STEPS[3]]
    np.testing.assert_allclose(again[-1], plain[3][-1], atol=_tolerance(mlx_llama))
    np.testing.assert_allclose(first[-1], plain[0][-1], atol=_tolerance(mlx_llama))


def test_long_calls_take_the_plain_path(mlx_llama):
    runner = mlx_llama.runner
    runner.enable_fused_decode(compiled=False, mode="layers")
    state = runner.new_state()
    assert not runner.fused.supports(state, fused_decode_cuda.MAX_ROWS + 1)
    assert runner.fused.supports(state, fused_decode_cuda.MAX_ROWS)
    runner.forward(list(range(3, 3 + fused_decode_cuda.MAX_ROWS + 1)), state, logits="none")
    assert state.offset == fused_decode_cuda.MAX_ROWS + 1


def test_unsupported_models_are_named(tiny_models, tmp_path):
    from tests.hybrid_models import make_hybrid_dir

    make_hybrid_dir(tmp_path, layout="hf")
    hybrid = load_model(tmp_path, EngineConfig(backend="mlx"))
    assert "full-attention" in unsupported_reason(hybrid.model)
    qwen3 = load_model(tiny_models.hf("qwen3")[0], EngineConfig(backend="mlx"))
    assert "q/k norm" in unsupported_reason(qwen3.model)
    numpy_model = load_model(tiny_models.gguf(qtype="F32")[0], EngineConfig(backend="numpy"))
    assert "MLX" in unsupported_reason(numpy_model.model)
    with pytest.raises(ValueError, match="full-attention"):  # the step takes it
        hybrid.runner.enable_fused_decode(mode="layers")


@pytest.mark.skipif(not fused_decode_cuda.is_available(), reason="needs MLX on a CUDA GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("mode,spread", [("layers", 0), ("step", 0), ("step", 1)])
@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "long"])
def test_rows_are_bit_identical_to_single_steps(mlx_llama, mode, spread, prompt, monkeypatch):
    """What makes bf16 greedy speculation exact: row i of a verify == the i-th decode step
    (with FQ_SPREAD, the verify's groups of rows dealt to warps of their own)."""
    monkeypatch.setitem(step_knobs.TUNING, "FQ_SPREAD", spread)
    runner = mlx_llama.runner
    runner.enable_fused_decode(compiled=True, mode=mode)
    single, _ = _steps(mlx_llama, STEPS, prompt)
    state = runner.new_state()
    runner.forward(prompt, state)
    rows = np.array(mlx_llama.ops.to_numpy(runner.forward(STEPS, state, logits="all")))
    for i in range(1, len(STEPS)):
        np.testing.assert_array_equal(rows[i - 1], single[i - 1][-1])


def _float32(path):
    import mlx.core as mx

    lm = load_model(path, EngineConfig(backend="mlx", dtype="float32"))
    lm.runner.fused = None
    assert lm.ops.dtype == mx.float32
    return lm


@pytest.mark.skipif(not fused_decode_cuda.is_available(), reason="needs MLX on a CUDA GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("source", ["q4_gguf", "f32_hf", "tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "long"])
def test_one_launch_step_reads_the_weights_as_stored(tiny_models, q4_k_m, source, prompt):
    """In float32 the one-launch step is the plain forward's arithmetic on the same values:
    the weights read from their quantized words (no dense copy), every format and row
    part a Q4_K_M file holds, and past 512 keys the attention split across blocks."""
    if source == "q4_gguf":
        path, _ = tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")
    elif source == "f32_hf":
        path, _ = tiny_models.hf("llama")
    else:
        path = q4_k_m(source)
    lm = _float32(path)
    plain, _ = _steps(lm, STEPS[:5], prompt)
    lm.runner.enable_fused_decode(mode="step")
    assert lm.runner.fused.stacked == []  # no dense copy
    step, _ = _steps(lm, STEPS[:5], prompt)
    for a, b in zip(plain, step, strict=True):
        np.testing.assert_allclose(b, a, atol=2e-4 * max(1.0, float(np.abs(a).max())), rtol=0)


@pytest.mark.skipif(not fused_decode_cuda.is_available(), reason="needs MLX on a CUDA GPU")
@pytest.mark.gpu
@pytest.mark.parametrize(
    "tuning,source",
    [
        (knob, source)
        for knob in (
            "FQ_BLOCKS=2",
            "FQ_SMEM_X=64",  # x staged in part: a verify's rows past the first from L2
            "FQ_SMEM_X=0",  # every warp reads x from L2
            "FQ_SMEM_X=32768,FQ_VERIFY_ROWS=8",  # past 48 KB: the launch's attribute
            "FQ_BLOCKS=2,FQ_VERIFY_BLOCKS=1,FQ_VERIFY_ROWS=8",  # each build its own blocks
            "FQ_BLOCKS=2,FQ_VERIFY_BLOCKS=1,FQ_VERIFY_ROWS=8,FQ_VERIFY_SMEM_X=24576",  # and x
            "FQ_BARRIER=1,FQ_L1_PREFETCH=1",  # release/acquire barrier, rows into L1 first
            "FQ_HEAD_ROWS=8",  # a verify's head in one pass of 8 rows
            "FQ_KFACTORS=1",  # Q4_K / Q6_K parts as their super-blocks' factors
            "FQ_STREAM=1,FQ_SLICES=16,FQ_VERIFY_ROWS=4",
            "FQ_STREAM=1,FQ_VERIFY_STREAM=0",  # the step's words decoded as used, not the verify's
            "FQ_SWIZZLE=1",  # the staged x's pieces permuted for the banks
            "FQ_SWIZZLE=1,FQ_SMEM_X=64,FQ_VERIFY_ROWS=8",  # and staged in part
        )
        for source in ("tiny-llama", "tiny-qwen3")
    ]
    + [("FQ_HEAD_ROWS=8,FQ_BARRIER=0", "tiny-qwen3.5")],
)
def test_every_build_knob_gives_a_row_the_same_bits(q4_k_m, tuning, source):
    """Each knob of kernels/fused_step_cuda.TUNING changes where the work runs, not what a
    row computes: steps and verify rows in the default dtype equal the engine build's
    (Qwen3: with the q/k norms' phase; Qwen3.5: its Gated DeltaNet layers' in_proj too)."""
    from engine.config import parse_step_tuning

    path = q4_k_m(source)
    out = []
    for config in (EngineConfig(backend="mlx"), EngineConfig(backend="mlx", step_tuning=tuning)):
        lm = load_model(path, config)
        kernel = lm.runner.fused.step_kernel
        assert parse_step_tuning(tuning).items() <= kernel.tuning.items() or not config.step_tuning
        single, _ = _steps(lm, STEPS, LONG_PROMPT)
        state = lm.runner.new_state()
        lm.runner.forward(LONG_PROMPT, state)
        rows = np.array(lm.ops.to_numpy(lm.runner.forward(STEPS, state, logits="all")))
        out.append((single, rows))
    (single0, rows0), (single1, rows1) = out
    for a, b in zip(single0, single1, strict=True):
        np.testing.assert_array_equal(b, a)
    np.testing.assert_array_equal(rows1, rows0)


@pytest.mark.skipif(not fused_decode_cuda.is_available(), reason="needs MLX on a CUDA GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_cuda_kernels_match_reference(rows):
    import mlx.core as mx

    from kernels.fused_decode_ref import ReferenceKernels

    s = fused_decode_cuda.Shapes(576, 9, 3, 64, 1536, 4096, 1e-5, 100000.0, True)
    cu, ref = fused_decode_cuda.CudaKernels(s), ReferenceKernels(s)
    rng = np.random.default_rng(rows)

    def a(*shape, dtype=mx.float32, scale=1.0):
        return mx.array((scale * rng.standard_normal(shape)).astype(np.float32)).astype(dtype)

    x, nw = a(rows, 576), a(576)
    pos = mx.array([37], dtype=mx.int32)
    w_qkv = a(15 * 64, 576, dtype=mx.bfloat16, scale=0.05)
    for got, want in zip(cu.qkv(x, nw, w_qkv, pos), ref.qkv(x, nw, w_qkv, pos), strict=True):
        np.testing.assert_allclose(
            np.array(got.astype(mx.float32)),
            np.array(want.astype(mx.float32)),
            atol=3e-2,
            rtol=2e-2,
        )
    q = a(rows, 576)
    keys, values = a(3, 128, 64, dtype=mx.bfloat16), a(3, 128, 64, dtype=mx.bfloat16)
    np.testing.assert_allclose(
        np.array(cu.attend(q, keys, values, pos)),
        np.array(ref.attend(q, keys, values, pos)),
        atol=2e-3,
    )
    act, w_down, res = a(rows, 1536), a(576, 1536, dtype=mx.bfloat16, scale=0.05), a(rows, 576)
    np.testing.assert_allclose(
        np.array(cu.residual(act, w_down, res)),
        np.array(ref.residual(act, w_down, res)),
        atol=2e-3,
        rtol=1e-3,
    )
    w_gu = a(2 * 1536, 576, dtype=mx.bfloat16, scale=0.05)
    # SiLU(gate) * up of two bf16-weight dot products: the reference's 16-row matmul
    # rounds its own way (16 rows failed atol 2e-3 on the H200; 1e-2 passed)
    np.testing.assert_allclose(
        np.array(cu.gate_up(x, nw, w_gu)), np.array(ref.gate_up(x, nw, w_gu)), atol=1e-2, rtol=1e-2
    )
    w_head = a(4096, 576, dtype=mx.bfloat16, scale=0.05)
    np.testing.assert_allclose(
        np.array(cu.head(x, nw, w_head)), np.array(ref.head(x, nw, w_head)), atol=2e-3, rtol=1e-3
    )


def test_speculation_is_refused_where_a_verify_is_not_exact(tiny_models, monkeypatch):
    """bf16 on a GPU without the fused kernels: the reply must not depend on drafting, so
    the session decodes plainly instead (and says so in the log)."""
    from engine.session import Session

    lm = load_model(tiny_models.gguf(qtype="F32")[0], EngineConfig(backend="numpy"))
    session = Session(lm)
    assert lm.runner.verify_is_exact()
    assert session._drafter("lookup")[0] is session.lookup
    monkeypatch.setattr(lm.runner, "verify_is_exact", lambda: False)
    assert session._drafter("lookup") == (None, None)
    assert session._drafter("auto") == (None, None)


def test_layers_are_brought_to_one_capacity(mlx_llama):
    """The one-launch step strides every layer's KV buffer by layer 0's capacity."""
    plain, _ = _steps(mlx_llama, STEPS[:2])
    runner = mlx_llama.runner
    runner.enable_fused_decode(compiled=False, mode="layers")
    state = runner.new_state()
    runner.forward(PROMPT, state)
    state.layers[0].reserve(3000)  # as if one layer had been grown on its own
    out = np.array(mlx_llama.ops.to_numpy(runner.forward([STEPS[0]], state)))
    assert len({kv.capacity() for kv in state.layers}) == 1
    assert state.layers[1].capacity() >= 3000
    np.testing.assert_allclose(out[-1], plain[0][-1], atol=_tolerance(mlx_llama))


def test_dense_copy_size_counts_every_weight(mlx_llama):
    """The runner enables the fused path only for models whose dense copy is small."""
    from engine.runner.fused import dense_bytes

    runner = mlx_llama.runner
    runner.enable_fused_decode(compiled=False, mode="layers")
    weights = [runner.fused.stacked[i] for i in (1, 2, 4, 5, 7)]  # not the norms
    copied = sum(int(w.nbytes) for w in weights)
    if not runner.fused.tied:  # the one-launch step also copies the embedding table
        copied += int(runner.fused.head_w.nbytes)
    assert dense_bytes(runner.model) == copied


def test_a_fused_path_that_fails_to_build_leaves_the_plain_path(mlx_llama, monkeypatch, caplog):
    """Kernels that do not compile (an older toolkit or GPU) must not stop the model loading."""
    from engine.runner import runner as runner_module

    def fail(*_args, **_kwargs):
        raise RuntimeError("nvrtc: error")

    monkeypatch.setattr(fused_decode_cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner_module, "FusedDecode", fail)
    runner = ModelRunner(mlx_llama.model, fused_decode_for(mlx_llama.model, EngineConfig()))
    assert runner.fused is None
    assert "plain MLX path" in caplog.text
    state = runner.new_state()
    assert runner.forward([3, 4, 5], state) is not None


@pytest.mark.parametrize("mode,compiled", VARIANTS)
def test_fused_steps_hand_out_the_last_layers_rows(mlx_llama, mode, compiled):
    """`forward_hidden` on the fused path: the rows the plain forward's last layer gives
    (a block drafter's context), for decode and verify rows, with the same logits."""
    runner = mlx_llama.runner
    plain_state = runner.new_state()
    runner.forward(PROMPT, plain_state)
    want_logits, want = runner.forward_hidden([5, 9, 33], plain_state, logits="all")
    runner.enable_fused_decode(compiled=compiled, mode=mode)
    state = runner.new_state()
    runner.forward(PROMPT, state)
    logits, got = runner.forward_hidden([5, 9, 33], state, logits="all")
    assert runner.last_path == "fused"
    assert got.shape == (3, mlx_llama.config.hidden_size)
    ops = mlx_llama.ops
    _assert_close_logits(mlx_llama, ops.to_numpy(logits), ops.to_numpy(want_logits))
    got, want = (
        np.asarray(ops.to_numpy(got), np.float64),
        np.asarray(ops.to_numpy(want), np.float64),
    )
    assert _relative_l2(got, want) <= (1e-5 if "float32" in str(ops.dtype) else 0.03)
    _, one = runner.forward_hidden([7], state, logits="none")  # the next step's row alone
    assert one.shape == (1, mlx_llama.config.hidden_size)


def test_the_one_launch_step_takes_llama3_rotations_and_qwen3_norms(q4_k_m):
    """Which path each family's shape may take, decided without a GPU: the step reads a
    rotation table, q/k norms and a hybrid's layers the five kernels do not."""
    from engine.runner.fused import rope_table, step_unsupported_reason

    llama = _float32(q4_k_m("tiny-llama")).model
    assert "scaled rope" in unsupported_reason(llama)
    assert step_unsupported_reason(llama) is None
    rope = llama.layers[0].mixer.rope
    np.testing.assert_array_equal(rope_table(llama), rope.inv_freq.astype(np.float32))
    qwen3 = _float32(q4_k_m("tiny-qwen3")).model
    assert "q/k norm" in unsupported_reason(qwen3)
    assert step_unsupported_reason(qwen3) is None
    hybrid = _float32(q4_k_m("tiny-qwen3.5")).model
    assert "full-attention" in unsupported_reason(hybrid)
    assert step_unsupported_reason(hybrid) is None  # tests/engine/test_fused_hybrid.py
    assert rope_table(hybrid) is not None  # its attention layers share one table
