"""The gated delta recurrence's two CUDA bodies without a GPU (where nvcc is installed),
compiled for an H100/H200 the way MLX wraps them (T, DK, Dv, H and P template arguments,
L read from q's shape): the replay's kernel and the prefill's, which fetches the next row
while one computes. Their numbers are checked on the GPU by
tests/kernels/test_gated_delta_cuda.py (the prefill's rows equal to the replay's, bit for
bit, at the same threads a column)."""

from __future__ import annotations

import re

import pytest

from kernels import cuda
from tests.kernels.test_fused_step_source import _SHAPE, _nvcc, _spills, needs_nvcc


def _wrapped(name: str, dtype: str, dk: int, dv: int, pair: int) -> str:
    consts = f"  using T = {dtype};\n  constexpr int DK = {dk}, Dv = {dv}, H = 16, P = {pair};\n"
    params = ", ".join(
        [f"const {dtype}* {n}" for n in ("q", "k", "v", "g", "beta")]
        + ["const __grid_constant__ Shape q_shape", "const float* state"]
        + [f"{dtype}* out", "float* state_out"]
    )
    body = consts + cuda.source(f"{name}.cu")
    kernel = f"__global__ void {name}({params}) {{\n{body}\n}}\n"
    head = "#include <cstdint>\n#include <cuda_bf16.h>\n" + _SHAPE
    return head + cuda.source("gated_delta_row.cuh") + kernel


def test_the_prefill_body_fetches_ahead_with_one_barrier_a_row():
    body = cuda.source("gated_delta_prefill.cu")
    loop = body[body.index("for (int t = 0; t < L; ++t)") :]
    assert loop.count("__syncthreads()") == 1
    assert "const int L = q_shape[0];" in body
    # the same row function, in the same order, as the replay's kernel
    assert body.count("gdn_row<DKP, P>(") == 1
    assert cuda.source("gated_delta_recurrent.cu").count("gdn_row<DKP, P>(") == 1


@needs_nvcc
@pytest.mark.parametrize("name", ["gated_delta_recurrent", "gated_delta_prefill"])
@pytest.mark.parametrize("dtype", ["float", "__nv_bfloat16"])
@pytest.mark.parametrize(
    ("dk", "dv", "pair"), [(128, 128, 2), (128, 128, 8), (256, 64, 4), (256, 64, 8)]
)
def test_each_body_compiles_without_spills(tmp_path, name, dtype, dk, dv, pair):
    """At 64 or fewer of a column's rows a thread (DK / P). At P = 1 the column's 128 floats
    spill (164 bytes of stores with nvcc 13.0), which is why PAIR is to become 2."""
    log = _nvcc(tmp_path, _wrapped(name, dtype, dk, dv, pair))
    assert _spills(log) == [0], log[-2000:]
    shared = [int(n) for n in re.findall(r"(\d+) bytes smem", log)]
    assert shared and max(shared) <= 2 * 2 * dk * 4, log[-2000:]
