"""MLX in a low-precision dtype keeps its weights and KV rows in that dtype and its
activations in float32 (kernels/ops_mlx.py): on the H200, bfloat16 activations were most of
the plain path's distance from float64 (docs/BENCHMARKS.md, agreement) and flipped the France
prompt's first token. Run on whatever device MLX has (its CPU here, the GPU there)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from engine.loader import load_model
from tests.conftest import TinyModels
from tests.tiny_models import VOCAB_SIZE, reference_forward
from tests.tolerances import engine_config

IDS = [int(t) for t in np.random.default_rng(0).integers(0, VOCAB_SIZE, 40)]


def relative_rms(got: mx.array, want: np.ndarray) -> float:
    diff = np.array(got.astype(mx.float32), np.float64) - want
    return float(np.sqrt(np.mean(diff**2) / np.mean(want**2)))


# float32 activations' error over bfloat16 ones'. MLX's CPU rounds bfloat16 products more
# often: 0.044 against 0.071 (Q4_1), 0.034 against 0.075 (Q8_0). Its CUDA kernels sum in
# float32 and round once an op, so there the tiny model's error is mostly its bfloat16
# weights': 0.034 against 0.038 (Q4_1) on the H200. A path that ignored act_dtype gives 1.0
# and fails on either.
BOUND = {mx.DeviceType.cpu: 0.8, mx.DeviceType.gpu: 0.95}


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_float32_activations_are_closer_to_float64_than_bfloat16_ones(
    tiny_models: TinyModels, qtype: str
) -> None:
    path, spec = tiny_models.gguf(qtype=qtype, embed_qtype="Q8_0")
    want = reference_forward(spec, IDS)
    errors = {}
    for activations in (mx.float32, mx.bfloat16):
        runner = load_model(path, engine_config("mlx-bfloat16")).runner
        runner.ops.act_dtype = activations  # bfloat16: the path before float32 activations
        state = runner.new_state()
        logits = runner.forward(IDS, state, logits="all")
        assert logits.dtype == activations
        # the KV rows stay in the compute dtype whatever the activations
        assert {a.dtype for layer in state.layers for a in layer.live_arrays()} == {mx.bfloat16}
        errors[str(activations)] = relative_rms(logits, want)
    bound = BOUND[mx.default_device().type]
    assert errors["mlx.core.float32"] <= bound * errors["mlx.core.bfloat16"], errors
