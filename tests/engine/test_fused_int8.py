"""FQ_INT8 on a CUDA GPU (kernels/cuda/fused_step.cuh's fq_dot_i8, fq_stage_i8): x rounded to
int8 in blocks of 32 meets 4- and 6-bit rows by dp4a. The knob changes a row's bits (x is
rounded), so the builds that keep them (tests/engine/test_fused_decode.py) do not cover
it: here its logits are checked against the plain forward in float32, as close as int8 x
allows, and a verify's rows against single steps bit for bit, with x staged in one pass and
in several. Without a GPU the knob's checks run (they refuse at load, on any machine)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineConfig, parse_step_tuning
from engine.loader import load_model
from kernels import fused_decode_cuda
from kernels.step_knobs import TuningRefused, check_int8, check_tuning, int8_rows_that_fit
from tests.engine.test_fused_decode import (
    LONG_PROMPT,
    STEPS,
    _float32,
    _relative_l2,
    _steps,
    assert_verify_equals_steps,
)

# x in int8 moves a tiny model's logits by 2-5% of their norm from float32's (on an H100:
# 2.0-5.2% on the Q4_1 model over these steps), as on this engine's CPU path (its int8
# kernels: 3.3-4.2% there, 1.7-2.5% on the Q4_K_M Llama); a wrong scale, row or pass misses
# by far more
INT8_GAP = 0.08


def test_the_knob_is_a_row_length():
    assert check_tuning({"FQ_INT8": 2048})["FQ_INT8"] == 2048
    for bad in (-32, 48):
        with pytest.raises(ValueError, match="FQ_INT8 must be 0 or a multiple of 32"):
            check_tuning({"FQ_INT8": bad})


def test_a_pass_that_cannot_fit_is_refused():
    """Llama-3.1-8B's MLP rows (14,336) take 16,160 bytes each staged: 8 rows a verify pass
    need 128 KB, more than the 8-row verify's 96 KB of staged x."""
    eight = {"FQ_INT8": 2048, "FQ_VERIFY_ROWS": 8, "FQ_VERIFY_SMEM_X": 24576}
    assert int8_rows_that_fit(14336, eight, verify=True) == 6
    with pytest.raises(ValueError, match="8 rows of 14336 int8s .* FQ_VERIFY_SMEM_X"):
        check_int8((4096, 4096, 14336), eight)
    check_int8((4096, 4096, 14336), eight | {"FQ_VERIFY_SMEM_X": 32768})
    check_int8((576, 576, 1536), eight)  # rows below FQ_INT8 keep float x: nothing to stage
    check_int8((4096, 14336), {"FQ_INT8": 0, "FQ_VERIFY_SMEM_X": 8})


def test_residual_phases_may_keep_float_x():
    """FQ_INT8_RESIDUAL=0: only the hidden size's rows (the normed phases') are staged in
    int8, so the 8B's MLP rows no longer need the verify's 128 KB; the knob is 0 or 1."""
    from kernels.fused_shapes import Shapes
    from kernels.fused_step_cuda import _row_lengths

    llama_8b = Shapes(4096, 32, 8, 128, 14336, 128256, 1e-5, 500000.0, False)
    assert _row_lengths(llama_8b) == (4096, 4096, 14336)
    assert _row_lengths(llama_8b, residual=False) == (4096,)
    eight = {"FQ_INT8": 2048, "FQ_VERIFY_ROWS": 8, "FQ_VERIFY_SMEM_X": 24576}
    check_int8(_row_lengths(llama_8b, residual=False), eight)
    with pytest.raises(TuningRefused, match="8 rows of 14336"):
        check_int8(_row_lengths(llama_8b), eight)
    assert check_tuning({"FQ_INT8_RESIDUAL": 0})["FQ_INT8_RESIDUAL"] == 0
    with pytest.raises(ValueError, match="FQ_INT8_RESIDUAL must be 0 or 1, not 2"):
        check_tuning({"FQ_INT8_RESIDUAL": 2})


def test_a_knob_the_model_cannot_take_stops_the_load(tiny_models, monkeypatch):
    """A build knob the user set and the model's shapes refuse (here FQ_INT8's passes) is an
    error at load, not a quiet fall back to the plain path (as a toolkit's failure is)."""
    from engine.runner import runner as runner_module

    def refuse(*_args, **_kwargs):
        check_int8((4096, 14336), {"FQ_INT8": 2048, "FQ_VERIFY_ROWS": 8})

    path, _ = tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")
    lm = load_model(path, EngineConfig(backend="mlx"))
    monkeypatch.setattr(fused_decode_cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner_module, "FusedDecode", refuse)
    config = EngineConfig(step_tuning="FQ_INT8=2048,FQ_VERIFY_ROWS=8")
    with pytest.raises(TuningRefused, match="raise FQ_VERIFY_SMEM_X"):
        runner_module.fused_decode_for(lm.model, config)


needs_gpu = pytest.mark.skipif(
    not fused_decode_cuda.is_available(), reason="needs MLX on a CUDA GPU"
)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("source", ["q4_gguf", "tiny-llama", "tiny-qwen3", "tiny-qwen3.5"])
@pytest.mark.parametrize(
    "knobs",
    # one pass; passes of 2 rows; float x in the residual phases
    ["", "FQ_VERIFY_ROWS=2,FQ_VERIFY_SMEM_X=320", "FQ_INT8_RESIDUAL=0"],
    ids=["one-pass", "passes", "normed-only"],
)
def test_int8_x_keeps_a_verify_exact(tiny_models, q4_k_m, source, knobs):
    """Every row of 32 weights or more takes int8 x (with FQ_INT8_RESIDUAL=0 only the normed
    phases' rows: the logits are then neither the float build's nor those of int8 in every
    phase): the logits stay within INT8_GAP of the float32 plain forward and move from the
    float build's (or the knob did nothing), and a verify's rows equal single steps bit for
    bit, whether its x is staged whole or in passes (1,280 bytes of shared memory hold 3 rows
    of 256 or 2 of 512: passes of 2 rows, so the 10 rows take 5)."""
    if source == "q4_gguf":
        path, _ = tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")
    else:
        path = q4_k_m(source)
    tuning = ",".join(k for k in ("FQ_INT8=32", knobs) if k)
    lm = _float32(path)
    plain, _ = _steps(lm, STEPS[:5], LONG_PROMPT)
    int8 = load_model(path, EngineConfig(backend="mlx", dtype="float32", step_tuning=tuning))
    assert parse_step_tuning(tuning).items() <= int8.runner.fused.step_kernel.tuning.items()
    got, _ = _steps(int8, STEPS[:5], LONG_PROMPT)
    gaps = [_relative_l2(b, a) for a, b in zip(plain, got, strict=True)]
    assert 0 < max(gaps) <= INT8_GAP, gaps
    floats = load_model(path, EngineConfig(backend="mlx", dtype="float32"))
    before, _ = _steps(floats, STEPS[:5], LONG_PROMPT)
    moved = [_relative_l2(b, a) for a, b in zip(before, got, strict=True)]
    assert min(moved) > 0, moved
    if "FQ_INT8_RESIDUAL=0" in knobs:
        every = load_model(
            path, EngineConfig(backend="mlx", dtype="float32", step_tuning="FQ_INT8=32")
        )
        apart = [
            _relative_l2(b, a)
            for a, b in zip(_steps(every, STEPS[:5], LONG_PROMPT)[0], got, strict=True)
        ]
        assert min(apart) > 0, apart
    single, _ = _steps(int8, STEPS, LONG_PROMPT)
    assert_verify_equals_steps(int8, single, LONG_PROMPT)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("source", ["q4_gguf", "tiny-llama"])
def test_int8_x_rounds_as_the_cpus_int8_kernels_do(tiny_models, q4_k_m, source):
    """The CPU's int8 kernels round the same x the same way (kernels/int8_ref.py; x * norm
    before the norm's 1 / rms or after it gives the same levels), so from a prompt the fused
    build takes whole (16 rows: its K/V rows in int8 too, where a longer prompt is prefilled
    on float x) the GPU's logits lie far nearer the CPU's int8 ones, K/V in float32, than
    either lies to float32's: a tenth of the distance at most (summation order; the Q8_0
    head, which the CPU meets with two levels of x and this build with float x). On an
    H100 after a 600-token float prefill they were 2.5-4.3% apart (session 41)."""
    if source == "q4_gguf":
        path, _ = tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")
    else:
        path = q4_k_m(source)
    prompt = list(range(3, 3 + fused_decode_cuda.MAX_ROWS))
    config = EngineConfig(backend="mlx", dtype="float32", step_tuning="FQ_INT8=32")
    got, _ = _steps(load_model(path, config), STEPS, prompt)
    cpu = load_model(path, EngineConfig(backend="numpy", cpu_matmul="int8", kv_dtype="float32"))
    near, _ = _steps(cpu, STEPS, prompt)
    plain, _ = _steps(_float32(path), STEPS, prompt)
    for a, b, c in zip(got, near, plain, strict=True):
        to_cpu, to_float = _relative_l2(a, b), _relative_l2(a, c)
        assert to_cpu < 0.1 * to_float, (to_cpu, to_float)


def _same_bits_as_int8(path, *builds: str) -> None:
    """Each of `builds` (knobs added to FQ_INT8=32) gives the logits of FQ_INT8=32 alone bit
    for bit, step by step, and its verify's rows equal its single steps."""
    first = None
    for knobs in ("", *builds):
        tuning = f"FQ_INT8=32{knobs}"
        lm = load_model(path, EngineConfig(backend="mlx", dtype="float32", step_tuning=tuning))
        assert parse_step_tuning(tuning).items() <= lm.runner.fused.step_kernel.tuning.items()
        single, _ = _steps(lm, STEPS, LONG_PROMPT)
        if first is None:
            first = single
            continue
        assert all(np.array_equal(a, b) for a, b in zip(first, single, strict=True)), knobs
        assert_verify_equals_steps(lm, single, LONG_PROMPT)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("source", ["q4_gguf", "tiny-llama", "tiny-qwen3.5"])
def test_int8_x_rounded_once_changes_no_bit(tiny_models, q4_k_m, source):
    """FQ_INT8_ONCE: the attention rounds its output and gate_up's blocks their 32
    activations into global memory, and o's and down's blocks copy those bytes instead of
    rounding x themselves (a hybrid's out_proj still rounds its own). The logits are those
    of FQ_INT8 alone bit for bit, step by step, and a verify's rows equal its single steps
    (its 2-row passes: outputs of a block of 32 for two rows at once)."""
    if source == "q4_gguf":
        path, _ = tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")
    else:
        path = q4_k_m(source)
    _same_bits_as_int8(path, ",FQ_INT8_ONCE=1", ",FQ_INT8_ONCE=1,FQ_VERIFY_ROWS=2")
