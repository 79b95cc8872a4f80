"""The one-launch prefill attention's body without a GPU (where nvcc is installed): compiled
for an H100/H200 the way MLX wraps it (T, D, BK and G template arguments, L and S read
from the shapes) for each head size it is built for, with no spill and its shared
memory within a launch's 48 KB. Its rows are checked on the GPU by
tests/kernels/test_prefill_attention_cuda.py."""

from __future__ import annotations

import re

import pytest

from kernels import cuda
from kernels import prefill_attention_cuda as pac
from tests.kernels.test_fused_step_source import _SHAPE, _nvcc, _spills, needs_nvcc


def _wrapped(dtype: str, d: int, group: int, name: str = "prefill_attention") -> str:
    """`name`'s body as MLX wraps it: T, D, G (and the scalar body's BK) as constants, the
    inputs and their shapes as parameters, the header before it."""
    keys = "" if name.endswith("_mma") else f"BK = {pac._KEYS_A_TILE[d]}, "
    consts = f"  using T = {dtype};\n  constexpr int D = {d}, {keys}G = {group};\n"
    params = ", ".join(
        [f"const {dtype}* q", "const __grid_constant__ Shape q_shape"]
        + [f"const {dtype}* k", "const __grid_constant__ Shape k_shape", f"const {dtype}* v"]
        + ["const float* scale", f"{dtype}* out"]
    )
    body = consts + cuda.source(f"{name}.cu")
    kernel = f"__global__ void {name}({params}) {{\n{body}\n}}\n"
    head = "#include <cstdint>\n#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n"
    header = cuda.source("prefill_attention_mma.cuh") if name.endswith("_mma") else ""
    return head + _SHAPE + header + kernel


def test_the_body_reads_its_lengths_from_the_shapes():
    body = cuda.source("prefill_attention.cu")
    assert "const int L = q_shape[2], S = k_shape[2];" in body
    assert "INFINITY" not in body.replace("no INFINITY", "")  # nvrtc's headers lack it


@needs_nvcc
@pytest.mark.parametrize("dtype", ["float", "__nv_bfloat16"])
@pytest.mark.parametrize(("d", "group"), [(64, 3), (128, 4), (256, 4)])
def test_each_head_size_compiles_without_spills(tmp_path, dtype, d, group):
    log = _nvcc(tmp_path, _wrapped(dtype, d, group))
    assert _spills(log) == [0], log[-2000:]
    shared = [int(n) for n in re.findall(r"(\d+) bytes smem", log)]
    assert shared and max(shared) <= 48 << 10, log[-2000:]


def test_the_tensor_core_body_reads_its_lengths_and_keeps_one_product_form():
    body = cuda.source("prefill_attention_mma.cu")
    assert "const int L = q_shape[2], S = k_shape[2];" in body
    # every product is the header's m16n8k16 (scores and weights times V), none by hand
    assert body.count("pa_mma(") == 2 and "fmaf(" not in body
    assert pac.MMA_HEADS == (64, 128) and pac.MMA_ROWS_A_BLOCK == 64


@needs_nvcc
@pytest.mark.parametrize("dtype", ["__nv_bfloat16", "__half"])
@pytest.mark.parametrize(("d", "group"), [(64, 3), (128, 4)])
def test_the_tensor_core_body_compiles_without_spills(tmp_path, dtype, d, group):
    log = _nvcc(tmp_path, _wrapped(dtype, d, group, "prefill_attention_mma"))
    assert _spills(log) == [0], log[-2000:]
    shared = [int(n) for n in re.findall(r"(\d+) bytes smem", log)]
    # K's rows and V's columns, 64 keys of D halves each with 8 of padding
    assert shared == [2 * (64 * (d + 8) + d * 72)], log[-2000:]
