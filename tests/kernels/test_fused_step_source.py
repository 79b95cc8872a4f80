"""The one-launch step kernel without a GPU: its attention split and scratch layout, and
(where nvcc is installed) its CUDA source compiled for an H100/H200 the way MLX wraps it,
with no register spills in bfloat16. The kernel's numbers are checked on the GPU by
tests/engine/test_fused_decode.py."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kernels import fused_step_cuda as fs
from kernels.fused_decode_cuda import MAX_ROWS, Shapes

SMOLLM2 = Shapes(576, 9, 3, 64, 1536, 49152, 1e-5, 100000.0, True)
TINY = Shapes(64, 4, 2, 16, 128, 256, 1e-5, 10000.0, False)


@pytest.mark.parametrize("head_dim", [8, 16, 32, 64, 128, 256])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_attention_chunks_fit_the_registers(head_dim, itemsize):
    keys = fs.chunk_keys(head_dim, itemsize)
    lanes_per_key = head_dim // 8
    keys_per_load = 32 // lanes_per_key
    assert keys % keys_per_load == 0 and 1 <= keys <= 64
    key_bytes = keys // keys_per_load * 8 * itemsize  # a lane's K slices
    value_regs = keys * max(1, max(1, head_dim // 32) * itemsize // 4)
    assert key_bytes <= 256 and value_regs <= 64


def test_default_model_takes_64_keys_a_warp():
    assert fs.chunk_keys(64, 2) == 64


@pytest.mark.parametrize("capacity", [16, 48, 1000, 1024, 8192, 32768])
def test_scratch_holds_activations_and_every_partial(capacity):
    s = SMOLLM2
    hd = s.heads * s.head_dim
    activations = MAX_ROWS * (2 * hd + 2 * s.hidden + s.intermediate)
    block_keys = 8 * fs.chunk_keys(s.head_dim, 2)
    partials = MAX_ROWS * s.heads * -(-capacity // block_keys) * (s.head_dim + 2)
    assert fs.scratch_size(s, capacity, 2) >= activations + partials


def test_unsupported_head_dims_are_named():
    odd = Shapes(640, 8, 8, 80, 1536, 1000, 1e-5, 10000.0, False)
    assert "head_dim 80" in fs.step_unsupported(odd)
    assert fs.step_unsupported(SMOLLM2) is None
    with pytest.raises(ValueError, match="head_dim 80"):
        fs.StepKernel(odd, 2)


def _wrapped_source(shapes: Shapes, layers: int, dtype: str, head_mode: int) -> str:
    """The kernel as MLX's cuda_kernel wraps it: inputs const, `<name>_shape` arguments
    for the shapes the body reads, template arguments as constants."""
    src = fs.step_source(shapes, layers)
    types = {"ids": "int32_t", "pos": "int32_t", "scratch": "float"}
    types |= {name: "float" for name in ("nw1", "nw2", "nwf")}
    params = []
    for name in fs.input_names(layers):
        params.append(f"const {types.get(name, dtype)}* {name}")
        if f"{name}_shape" in src:
            params.append(f"const __grid_constant__ Shape {name}_shape")
    for name in fs.output_names():
        params.append(f"{'float' if name == 'logits' else 'uint32_t'}* {name}")
    itemsize = 4 if dtype == "float" else 2
    consts = (
        f"  using T = {dtype};\n  constexpr int HEAD_MODE = {head_mode}, PREFETCH = 1, PROF = 1;\n"
        f"  constexpr int CK = {fs.chunk_keys(shapes.head_dim, itemsize)};\n"
    )
    return "".join(
        [
            "#include <cstdint>\n",
            "struct Shape { int32_t v[8]; __device__ int32_t operator[](int i) const"
            " { return v[i]; } };\n",
            fs._STEP_HEADER,
            "__global__ void __launch_bounds__(256) fs_step(" + ",\n".join(params) + ") {\n",
            consts + src + "\n}\n",
        ]
    )


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize(
    "shapes,layers,head_mode", [(SMOLLM2, 30, 1), (SMOLLM2, 30, 2), (TINY, 2, 2)]
)
def test_source_compiles_without_spills(tmp_path, shapes, layers, head_mode):
    cu = tmp_path / "step.cu"
    cu.write_text(_wrapped_source(shapes, layers, "__nv_bfloat16", head_mode))
    out = subprocess.run(
        ["nvcc", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", "-diag-suppress", "177,550",
         "-c", str(cu), "-o", str(tmp_path / "step.o")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "0 bytes spill stores" in out.stderr, out.stderr[-3000:]
