"""The gated delta recurrence's two CUDA bodies without a GPU (where nvcc is installed),
compiled for an H100/H200 the way MLX wraps them (T, DK, Dv, H and P template arguments,
L read from q's shape, so one build takes a verify's rows, a replay's and a prefill
chunk's): the replay's kernel and the prefill's, which fetches the next row while one
computes. Their numbers are checked on the GPU by
tests/kernels/test_gated_delta_cuda.py (the prefill's rows equal to the replay's, bit for
bit, at the same threads a column)."""

from __future__ import annotations

import re

import pytest

from kernels import cuda, gated_delta_cuda
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


def test_the_row_count_is_no_template_argument():
    for name in ("gated_delta_recurrent", "gated_delta_prefill"):
        assert "const int L = q_shape[0];" in cuda.source(f"{name}.cu")
    # the template's names, as the wrapper passes them (no L among them)
    import inspect

    wrapper = inspect.getsource(gated_delta_cuda.gated_delta_recurrent)
    assert '("L", L)' not in wrapper and '("P", pair)' in wrapper


@needs_nvcc
@pytest.mark.parametrize("pair,spill", [(1, 320), (2, 0)])
@pytest.mark.parametrize("dtype", ["__nv_bfloat16", "float"])
def test_the_recurrence_compiles_within_its_registers(tmp_path, pair, spill, dtype):
    """A column of 128 floats a thread (PAIR 1, the value until session 33) spills 150-300
    bytes with nvcc 13.0, as it did with the row count built in (~300); half a column
    (PAIR 2, the value now) none."""
    log = _nvcc(tmp_path, _wrapped("gated_delta_recurrent", dtype, 128, 128, pair))
    spills = _spills(log)
    assert len(spills) == 1 and spills[0] <= spill, log[-2000:]


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
    """Both bodies at 64 or fewer of a column's rows a thread (DK / P)."""
    log = _nvcc(tmp_path, _wrapped(name, dtype, dk, dv, pair))
    assert _spills(log) == [0], log[-2000:]
    shared = [int(n) for n in re.findall(r"(\d+) bytes smem", log)]
    assert shared and max(shared) <= 2 * 2 * dk * 4, log[-2000:]
