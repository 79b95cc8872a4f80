"""The CUDA recurrence's source without a GPU (where nvcc is installed): compiled for an
H100/H200 the way MLX wraps it, its row count read from q's shape, so one build takes a
verify's rows, a replay's and a prefill chunk's. Its numbers are checked on the GPU by
tests/kernels/test_gated_delta_cuda.py."""

from __future__ import annotations

import pytest

from kernels import gated_delta_cuda
from tests.kernels.test_fused_step_source import _SHAPE, _nvcc, _spills, needs_nvcc


def test_the_row_count_is_no_template_argument():
    assert "const int L = q_shape[0];" in gated_delta_cuda._SOURCE
    # the template's names, as the wrapper passes them (no L among them)
    import inspect

    wrapper = inspect.getsource(gated_delta_cuda.gated_delta_recurrent)
    assert '("L", L)' not in wrapper and '("P", pair)' in wrapper


@needs_nvcc
@pytest.mark.parametrize("pair,spill", [(1, 320), (2, 0)])
@pytest.mark.parametrize("dtype", ["__nv_bfloat16", "float"])
def test_the_recurrence_compiles_within_its_registers(tmp_path, pair, spill, dtype):
    """A column of 128 floats a thread (PAIR 1, the value today) spills 200-300 bytes with
    nvcc 13.0, as it did with the row count built in (~300); half a column (PAIR 2) none."""
    consts = f"  using T = {dtype};\n  constexpr int DK = 128, Dv = 128, H = 16, P = {pair};\n"
    params = [f"const {dtype}* {n}" for n in ("q", "k", "v", "g", "beta")]
    params += ["const float* state", "const __grid_constant__ Shape q_shape"]
    params += [f"{dtype}* out", "float* state_out"]
    kernel = (
        f"__global__ void gdn({', '.join(params)}) {{\n{consts}{gated_delta_cuda._SOURCE}\n}}\n"
    )
    source = (
        "#include <cstdint>\n#include <cuda_bf16.h>\n" + _SHAPE + gated_delta_cuda._HEADER + kernel
    )
    log = _nvcc(tmp_path, source)
    spills = _spills(log)
    assert len(spills) == 1 and spills[0] <= spill, log[-2000:]
