"""The nucleus pack kernel's source without a GPU (where nvcc is installed): compiled for an
H100/H200 the way MLX wraps it (K a template argument, V read from the rows' shape), a
block of 1,024 threads keeping its registers, its shared memory within a launch's 48 KB.
Its numbers are checked on the GPU by tests/kernels/test_nucleus_pack_cuda.py."""

from __future__ import annotations

import re

import pytest

from engine import sampling_candidates
from kernels import cuda, nucleus_pack_cuda
from tests.kernels.test_fused_step_source import _SHAPE, _nvcc, _spills, needs_nvcc


def _wrapped(k: int) -> str:
    """The kernel as mx.fast.cuda_kernel builds it for a pack of k (K a constant here)."""
    params = "const float* rows, const __grid_constant__ Shape rows_shape, const float* settings"
    params += ", const float* u"
    params += ", float* packed, uint32_t* token"
    body = f"  constexpr int K = {k};\n" + cuda.source("nucleus_pack.cu")
    kernel = f"__global__ void nucleus_pack({params}) {{\n{body}\n}}\n"
    return "#include <cstdint>\n" + _SHAPE + cuda.source("nucleus_pack.cuh") + kernel


def test_the_body_reads_the_row_length_from_its_shape():
    body = cuda.source("nucleus_pack.cu")
    assert "const int V = rows_shape[1];" in body
    # host-written: each read once, into shared memory
    assert len(re.findall(r"\bsettings\[", body)) == 1 and len(re.findall(r"\bu\[", body)) == 1


@needs_nvcc
@pytest.mark.parametrize("k", [sampling_candidates.K, 1024])
def test_the_kernel_compiles_within_a_blocks_registers(tmp_path, k):
    """A block of 1,024 threads (nucleus_pack_cuda.THREADS) launches only where a thread
    holds at most 64 registers (an SM's 65,536; MLX's wrapper sets no launch bounds, so
    ptxas does not aim for it): no more, no spill, and the static shared memory (the pack's
    K places several times over, the bins) within the 48 KB a launch takes."""
    log = _nvcc(tmp_path, _wrapped(k) + "\n")
    assert _spills(log) == [0], log[-2000:]
    registers = [int(n) for n in re.findall(r"Used (\d+) registers", log)]
    assert registers and max(registers) <= 65536 // nucleus_pack_cuda.THREADS, log[-2000:]
    shared = [int(n) for n in re.findall(r"(\d+) bytes smem", log)]
    assert shared and max(shared) <= 48 << 10, log[-2000:]
