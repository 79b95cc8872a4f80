"""FQ_WIDE on a CUDA GPU (kernels/cuda/fused_step.cuh's fq_dot_wide): 4-bit rows read 16
bytes a lane. The knob changes a row's bits (a lane sums other weights), so the tests of
builds that keep them (tests/engine/test_fused_decode.py) do not cover it: here its
logits are checked against the plain forward in float32 and against the narrow build in
bfloat16, and a verify's rows against single steps, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineConfig, parse_step_tuning
from engine.loader import load_model
from kernels import fused_decode_cuda
from tests.engine.test_fused_decode import (
    LONG_PROMPT,
    STEPS,
    _float32,
    _relative_l2,
    _steps,
    assert_verify_equals_steps,
)


@pytest.mark.skipif(not fused_decode_cuda.is_available(), reason="needs MLX on a CUDA GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("source", ["q4_gguf", "tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("knobs", ["FQ_WIDE_SLICES=1", "FQ_WIDE_SLICES=8,FQ_VERIFY_ROWS=8"])
def test_wide_loads_keep_a_verify_exact(tiny_models, q4_k_m, source, knobs):
    """FQ_WIDE (16-byte slices of 4-bit rows, here every row of 32 weights or more): a lane
    sums other weights, so the logits move by rounding alone (float32: as close to the plain
    forward as the narrow loads; bfloat16: within a hundredth of the narrow build's, and not
    equal, or the knob did nothing), and a verify's rows still equal single steps bit for bit."""
    if source == "q4_gguf":
        path, _ = tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")
    else:
        path = q4_k_m(source)
    tuning = f"FQ_WIDE=32,FQ_SWIZZLE=1,{knobs}"
    lm = _float32(path)
    plain, _ = _steps(lm, STEPS[:5], LONG_PROMPT)
    wide = load_model(path, EngineConfig(backend="mlx", dtype="float32", step_tuning=tuning))
    assert parse_step_tuning(tuning).items() <= wide.runner.fused.step_kernel.tuning.items()
    for a, b in zip(plain, _steps(wide, STEPS[:5], LONG_PROMPT)[0], strict=True):
        np.testing.assert_allclose(b, a, atol=2e-4 * max(1.0, float(np.abs(a).max())), rtol=0)
    narrow = load_model(path, EngineConfig(backend="mlx"))
    lm = load_model(path, EngineConfig(backend="mlx", step_tuning=tuning))
    single, _ = _steps(lm, STEPS, LONG_PROMPT)
    before, _ = _steps(narrow, STEPS, LONG_PROMPT)
    assert_verify_equals_steps(lm, single, LONG_PROMPT)
    gaps = [_relative_l2(a, b) for a, b in zip(single, before, strict=True)]
    assert 0 < max(gaps) <= 0.01, gaps
