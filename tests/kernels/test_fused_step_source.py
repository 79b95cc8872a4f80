"""The fused CUDA kernels without a GPU: the one-launch step's attention split and scratch
layout, and (where nvcc is installed) the CUDA sources of both paths compiled for an
H100/H200 the way MLX wraps them, the one-launch step as the engine builds it keeping its
registers in bfloat16 (a few bytes of spill at most) and its shared memory within what a
launch takes, and the probe's stamped build of it. Their numbers are checked on the GPU by
tests/engine/test_fused_decode.py."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from bench.gpu import step_stamps
from kernels import fused_decode_cuda as fd
from kernels import fused_step_cuda as fs
from kernels import gated_delta_cuda, step_weights
from kernels.fused_decode_cuda import MAX_ROWS
from kernels.fused_shapes import GdnShapes, Shapes

SMOLLM2 = Shapes(576, 9, 3, 64, 1536, 49152, 1e-5, 100000.0, True)
TINY = Shapes(64, 4, 2, 16, 128, 256, 1e-5, 10000.0, False)
LLAMA_8B = Shapes(4096, 32, 8, 128, 14336, 128256, 1e-5, 500000.0, False)
QWEN3_4B = Shapes(2560, 32, 8, 128, 9728, 151936, 1e-6, 1000000.0, False, qk_norm=True)
# Qwen3.5-0.8B: 24 layers, every fourth gated full attention (partial rotary), the rest
# Gated DeltaNet; value heads in a GGUF's tiled order
QWEN35_LINEAR = GdnShapes(tuple(i for i in range(24) if (i + 1) % 4), 16, 16, 128, 128, 4, True)
QWEN35_08B = Shapes(1024, 8, 2, 256, 3584, 248320, 1e-6, 1e7, False, qk_norm=True,
                    attn_gate=True, rope_dims=64, linear=QWEN35_LINEAR)  # fmt: skip
# bench.shapes' tiny Qwen3.5: 2 key heads, 4 value heads of 64, layer 3 attention
TINY_QWEN35 = Shapes(256, 4, 2, 64, 512, 1024, 1e-6, 1e7, False, qk_norm=True, attn_gate=True,
                     rope_dims=16, linear=GdnShapes((0, 1, 2), 2, 4, 64, 64, 4, True))  # fmt: skip
# Gemma 3 270M: 18 layers, every sixth global, the rest sliding over 512 positions; sandwich
# norms, GELU, embeddings times sqrt(640); and the oracle fixture's tiny one (window 8)
GEMMA3_270M = Shapes(640, 4, 1, 256, 2048, 262144, 1e-6, 1e6, False, qk_norm=True,
                     sliding=tuple(i for i in range(18) if (i + 1) % 6), window=512,
                     sandwich=True, act="gelu_tanh", embed_scale=640**0.5,
                     attn_scale=1 / 16)  # fmt: skip
TINY_GEMMA3 = Shapes(256, 2, 1, 32, 32, 320, 1e-6, 1e6, False, qk_norm=True,
                     sliding=(0, 1, 2, 3, 4), window=8, sandwich=True, act="gelu_tanh",
                     embed_scale=16.0, attn_scale=32**-0.5)  # fmt: skip


@pytest.mark.parametrize("head_dim", [8, 16, 32, 64, 128, 256])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_attention_chunks_fit_the_registers(head_dim, itemsize):
    keys = fs.chunk_keys(head_dim, itemsize)
    lanes_per_key = head_dim // 8
    keys_per_load = 32 // lanes_per_key
    assert keys % keys_per_load == 0 and 1 <= keys <= 64
    key_bytes = keys // keys_per_load * 8 * itemsize  # a lane's K slices
    value_regs = keys * max(1, max(1, head_dim // 32) * itemsize // 4)
    assert key_bytes <= 128 and value_regs <= 32


def test_default_model_takes_32_keys_a_warp():
    assert fs.chunk_keys(64, 2) == 32


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
        fs.StepKernel(odd, 2, (4,))


_SHAPE = (
    "struct Shape { int32_t v[8]; __device__ int32_t operator[](int i) const { return v[i]; } };\n"
)
_FLOAT_NAMES = {"scratch", "nw", "x", "q", "a", "res", "logits", "y", "act", "o", "gconvw",
                "gvec", "gstate", *fs._NORMS}  # fmt: skip


def _kernel(name: str, body: str, inputs: list[str], outputs: list[str], dtype: str) -> str:
    """One kernel as MLX's cuda_kernel wraps it: inputs const, `<name>_shape` arguments for
    the shapes the body reads, no launch bounds (with `__launch_bounds__(256)` ptxas aims at
    two blocks an SM and spills the 8B build at 128 registers)."""
    types = {"ids": "int32_t", "pos": "int32_t"} | {n: "float" for n in _FLOAT_NAMES}
    types |= {"sstack": "float", "cstack": dtype, "gconv": dtype}
    types |= {n: "uint32_t" for n in ("sync_buf", "status", "stamps", "words", "scales", "biases")}
    types |= {"meta": "int64_t"}
    params = []
    for n in inputs:
        params.append(f"const {types.get(n, dtype)}* {n}")
        if f"{n}_shape" in body:
            params.append(f"const __grid_constant__ Shape {n}_shape")
    params += [f"{types.get(n, dtype)}* {n}" for n in outputs]
    return f"__global__ void {name}({', '.join(params)}) {{\n{body}\n}}\n"


def _step_source(
    shapes: Shapes,
    layers: int,
    dtype: str,
    head_mode: int,
    stamped: bool = False,
    maxm: int = MAX_ROWS,
    formats: tuple[int, ...] = (4, 8),
    tuning: dict[str, int] | None = None,
    roles: tuple[tuple[int, ...], ...] | None = None,
) -> str:
    """The engine's step kernel as MLX wraps it, or with `stamped` the probe's build."""
    itemsize = 4 if dtype == "float" else 2
    consts = (
        f"  using T = {dtype};\n  using TC = {dtype};\n"
        f"  constexpr int HEAD_MODE = {head_mode}, PREFETCH = 1;\n"
        f"  constexpr int CK = {fs.chunk_keys(shapes.head_dim, itemsize)};\n"
        f"  constexpr int MAXM = {maxm};\n"
    )
    outputs = fs.output_names() + (["stamps"] if stamped else [])
    if shapes.linear is not None:
        outputs += ["gstate", "gconv"]
    if stamped:
        body, header = step_stamps.stamped_source(shapes, layers), step_stamps.STAMPED_HEADER
    else:
        body, header = fs.step_source(shapes, layers), fs.STEP_HEADER
    header = fs.formats_header(formats, tuning, maxm > 1, roles) + header
    kernel = _kernel("fs_step", consts + body, fs.input_names(layers, shapes), outputs, dtype)
    return "#include <cstdint>\n" + _SHAPE + header + kernel


def test_the_engines_step_kernel_holds_no_profiling_code():
    """Cycle stamps live in the probe's own build (bench/gpu/step_stamps.py)."""
    source = fs.STEP_HEADER + fs.step_source(SMOLLM2, 30)
    assert "stamps" not in source and "globaltimer" not in source and "PROF" not in source
    assert "stamps" not in fs.output_names()


def _nvcc(tmp_path, source: str) -> str:
    cu = tmp_path / "k.cu"
    cu.write_text(source)
    out = subprocess.run(
        ["nvcc", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", "-diag-suppress", "177,550",
         "-c", str(cu), "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stderr


def _spills(log: str) -> list[int]:
    """Bytes of spill stores of each function ptxas compiled."""
    return [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]


# Builds at the 255-register limit move a few bytes of spill either way with edits that
# change no instruction they run (session 16: Qwen3-4B's verify went from 0 to 8 bytes with
# constants for sliding layers that fold away; nvcc 13.5 spills 16 where 13.0 spills
# none): more than this is a regression of the build's registers.
SPILL_SLACK = 16


def _keeps_registers(log: str) -> bool:
    spills = _spills(log)
    return bool(spills) and max(spills) <= SPILL_SLACK


def _fits_a_launch(log: str, tuning: dict | None, verify: bool) -> bool:
    """Whether each build's static shared memory and the staged x (dynamic) fit a launch.
    As the H200 runs behave: a staged x past 48 KB is opted in (the 4-row verify's 64 KB
    runs, beside ~10 KB static: within an H200 block's 227 KB), one within 48 KB is not, so
    the static memory must fit beside it in 48 KB (session 16's hybrid verify, 18.8 KB
    beside 32 KB, failed to launch: invalid argument)."""
    dynamic = 4 * fs.smem_x(tuning or {}, verify)
    limit = 48 << 10 if dynamic <= 48 << 10 else 227 << 10
    static = [int(n) for n in re.findall(r"(\d+) bytes smem", log)]
    return bool(static) and all(n + dynamic <= limit for n in static)


def _layer_bytes(shapes: Shapes) -> int:
    """A layer's table at 6 bits a weight (4-bit words, float32 scale and bias a group of 32)."""
    d, f = shapes.hidden, shapes.intermediate
    qkv = (shapes.heads + 2 * shapes.kv_heads) * shapes.head_dim
    return (d * qkv + shapes.heads * shapes.head_dim * d + 3 * d * f) * 6 // 8


# the engine's dispatch by role (WeightTable.roles: qkv, o, gate_up, down, head)
Q4_1 = ((4,), (4,), (4,), (4,), (8,))  # SmolLM2: Q4_1 layers, a Q8_0 table
Q4_K_M = ((4, 6), (4,), (4,), (4, 6), (6,))  # Q6_K in attn_v, ffn_down and the head
KFACTORS = ((68, 134), (68,), (68,), (68, 134), (134,))

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (CUDA toolkit)")
BUILDS = ((1, 1), (MAX_ROWS, 2))  # a step's (rows, head mode) and a verify's


@needs_nvcc
@pytest.mark.parametrize(
    "shapes,layers,head_mode,maxm,roles",
    [
        (SMOLLM2, 30, 1, 1, Q4_1),  # Q4_1 layers, a Q8_0 table: decode's build
        (SMOLLM2, 30, 2, MAX_ROWS, Q4_1),  # a verify's
        (LLAMA_8B, 32, 1, 1, Q4_K_M),  # Q4_K and Q6_K (v, down), a Q6_K head
        (LLAMA_8B, 32, 2, MAX_ROWS, Q4_K_M),
        (QWEN3_4B, 36, 1, 1, Q4_K_M),  # q/k norm: a sixth phase
        (QWEN3_4B, 36, 2, MAX_ROWS, Q4_K_M),
        (TINY, 2, 2, MAX_ROWS, ((5, step_weights.BF16),) * 4 + ((8,),)),
        (LLAMA_8B, 32, 1, 1, KFACTORS),  # K-quants as their factors (FQ_KFACTORS)
        (LLAMA_8B, 32, 2, MAX_ROWS, KFACTORS),
    ],
)
def test_step_source_compiles_keeping_its_registers(
    tmp_path, shapes, layers, head_mode, maxm, roles
):
    """The engine's one-block builds keep their registers: each decode build of one block,
    and every verify build with tuning_for's knobs for the shape's layer size (one block,
    4 rows a pass on the large Llama). A decode of two blocks an SM spills at 128 registers
    (156 bytes on Llama-8B, 1.6 KB with q/k norm), measured 1.3-1.6x faster all the same."""
    tuning = fs.tuning_for(_layer_bytes(shapes), shapes.qk_norm) if maxm > 1 else None
    formats = tuple(sorted({f for role in roles[:4] for f in role}))
    source = _step_source(
        shapes, layers, "__nv_bfloat16", head_mode, maxm=maxm, formats=formats, tuning=tuning,
        roles=roles,
    )  # fmt: skip
    log = _nvcc(tmp_path, source)
    assert _fits_a_launch(log, tuning, maxm > 1), log[-3000:]
    assert _keeps_registers(log), log[-3000:]


@needs_nvcc
@pytest.mark.parametrize(
    "shapes,layers", [(QWEN35_08B, 24), (TINY_QWEN35, 4)], ids=["0.8B", "tiny"]
)
@pytest.mark.parametrize("maxm,head_mode", BUILDS)
@pytest.mark.parametrize("pair", [1, 2])
def test_a_hybrids_step_compiles(tmp_path, shapes, layers, maxm, head_mode, pair, monkeypatch):
    """Gated DeltaNet layers beside gated attention with partial rotary embeddings, as the
    engine builds them, a thread a value column (gated_delta_cuda.PAIR) or two. The 0.8B
    builds' spills (~2 KB at PAIR 1, 0.5-1.5 KB at 2, with nvcc 13.0) are a speed matter
    for the GPU's tuning, not checked."""
    monkeypatch.setattr(gated_delta_cuda, "PAIR", pair)
    tuning = fs.tuning_for(_layer_bytes(shapes), True, hybrid=True)
    roles = ((4, 6, 32), (4, 6), (4,), (4, 6), (6,))  # dense float32 alpha / beta rows too
    source = _step_source(shapes, layers, "__nv_bfloat16", head_mode, maxm=maxm,
                          formats=(4, 6, 32), tuning=tuning, roles=roles)  # fmt: skip
    assert "#define FS_HYBRID 1" in source and f"GDN_PAIR = {pair};" in source
    log = _nvcc(tmp_path, source)
    assert _fits_a_launch(log, tuning, maxm > 1), log[-3000:]


@needs_nvcc
@pytest.mark.parametrize(
    "shapes,layers", [(GEMMA3_270M, 18), (TINY_GEMMA3, 6)], ids=["270M", "tiny"]
)
@pytest.mark.parametrize("maxm,head_mode", BUILDS)
def test_gemma3s_step_compiles_keeping_its_registers(tmp_path, shapes, layers, maxm, head_mode):
    """Sliding layers through their rings, sandwich norms and GELU, with the formats the
    real Gemma 3 270M Q4_K_M's table holds by role (Q5_0 and Q8_0 rows, dense float32)."""
    tuning = fs.tuning_for(_layer_bytes(shapes), shapes.qk_norm) if maxm > 1 else None
    roles = ((5, 8), (4,), (5,), (4, 32), (8,))
    source = _step_source(shapes, layers, "__nv_bfloat16", head_mode, maxm=maxm,
                          formats=(4, 5, 8, 32), tuning=tuning, roles=roles)  # fmt: skip
    assert "const int ring = k0_shape[1];" in source and "SANDWICH = true;" in source
    first_full = min(set(range(layers)) - set(shapes.sliding))
    assert "ACT = 1;" in source and f"cap = k{first_full}_shape[1];" in source
    log = _nvcc(tmp_path, source)
    assert _fits_a_launch(log, tuning, maxm > 1), log[-3000:]
    assert _keeps_registers(log), log[-3000:]


@needs_nvcc
@pytest.mark.parametrize(
    "shapes,layers,slots",
    [(SMOLLM2, 30, 152), (TINY_QWEN35, 4, 23), (TINY_GEMMA3, 6, 50)],
    ids=["smollm2", "hybrid", "gemma3"],
)
def test_the_probes_stamped_step_compiles(tmp_path, shapes, layers, slots):
    """A stamp row a barrier: 5 a plain layer; a hybrid's 5 a linear layer and 6 (q/k norm)
    its attention layer; Gemma's 8 (q/k norm, sandwich norms); the embedding and head."""
    source = _step_source(shapes, layers, "__nv_bfloat16", 1, stamped=True)
    assert f"fs_stamps_end({slots});" in source
    _nvcc(tmp_path, source)


@needs_nvcc
def test_five_kernel_sources_compile(tmp_path):
    kernels = []
    for kind, (inputs, outputs) in fd._SIGNATURES.items():
        consts = "  using T = __nv_bfloat16;\n"
        if kind == "residual":  # K and N are the call's template arguments
            consts += "  constexpr int K = 1536, N = 576;\n"
        body = consts + fd.source_of(kind, SMOLLM2)
        kernels.append(_kernel(f"fd_{kind}", body, inputs, outputs, "__nv_bfloat16"))
    _nvcc(tmp_path, "#include <cstdint>\n" + _SHAPE + fd.header() + "".join(kernels))


@needs_nvcc
def test_a_two_block_build_keeps_its_registers_for_two_blocks(tmp_path):
    """FQ_BLOCKS states launch bounds through `__global__` (MLX writes the signature):
    ptxas must then fit 256 threads twice in an SM's 65,536 registers."""
    source = _step_source(LLAMA_8B, 32, "__nv_bfloat16", 1, maxm=1, formats=(4, 6),
                          tuning={"FQ_BLOCKS": 2})  # fmt: skip
    log = _nvcc(tmp_path, source)
    used = [int(n) for n in re.findall(r"Used (\d+) registers", log)]
    assert used and max(used) <= 128, log[-3000:]


@needs_nvcc
@pytest.mark.parametrize("maxm,head_mode", BUILDS)
def test_the_streaming_dot_products_compile(tmp_path, maxm, head_mode):
    """bench/gpu/step_tuning.py's other builds: words decoded as used, deeper chunks, more
    rows of x a pass, a verify's rows all taken by the warps of their outputs (FQ_SPREAD 0;
    the engine's builds deal a verify's groups of rows to warps), its head's rows in passes
    of 8."""
    tuning = {"FQ_SLICES": 16, "FQ_STREAM": 1, "FQ_VERIFY_ROWS": 4, "FQ_SMEM_X": 8192,
              "FQ_BARRIER": 1, "FQ_L1_PREFETCH": 1, "FQ_SPREAD": 0, "FQ_HEAD_ROWS": 8}  # fmt: skip
    source = _step_source(SMOLLM2, 30, "__nv_bfloat16", head_mode, maxm=maxm, tuning=tuning)
    assert "#define FQ_STREAM 1" in source
    _nvcc(tmp_path, source)


def test_a_spill_of_any_size_is_seen():
    """'0 bytes spill stores' is also a substring of '20 bytes spill stores'."""
    log = "    560 bytes stack frame, 20 bytes spill stores, 48 bytes spill loads\n"
    assert _spills(log) == [20]
    assert _spills(log.replace("20 bytes", "0 bytes")) == [0]
    assert not _keeps_registers(log) and _keeps_registers(log.replace("20 bytes", "8 bytes"))


@needs_nvcc
@pytest.mark.parametrize("maxm,head_mode", BUILDS)
@pytest.mark.parametrize("shapes,wide", [(LLAMA_8B, 2048), (TINY, 32)], ids=["8B", "tiny"])
def test_the_wide_loads_compile(tmp_path, shapes, wide, maxm, head_mode):
    """FQ_WIDE's 16-byte slices (4-bit rows of the layers from `wide` weights up) beside the
    narrow ones (Q6_K rows, the head), the staged x swizzled, with the large shape's knobs;
    the shared memory fits a launch (the spills are timed on the GPU, not checked here)."""
    knobs = {"FQ_WIDE": wide, "FQ_SWIZZLE": 1}
    tuning = fs.tuning_for(_layer_bytes(shapes), shapes.qk_norm) | knobs
    source = _step_source(shapes, 2, "__nv_bfloat16", head_mode, maxm=maxm, formats=(4, 6),
                          tuning=tuning, roles=Q4_K_M)  # fmt: skip
    assert f"#define FQ_WIDE {wide}" in source and "#define FQ_SWIZZLE 1" in source
    assert _fits_a_launch(_nvcc(tmp_path, source), tuning, maxm > 1)


_TINY_HYBRID_ROLES = ((4, 6, 32), (4, 6), (4,), (4, 6), (6,))


@needs_nvcc
@pytest.mark.parametrize("maxm,head_mode", BUILDS)
@pytest.mark.parametrize(
    "shapes,layers,int8,roles,knobs",
    [
        (LLAMA_8B, 2, 2048, KFACTORS, {}),
        (LLAMA_8B, 2, 2048, KFACTORS, {"FQ_INT8_ONCE": 1}),
        (TINY_QWEN35, 4, 32, _TINY_HYBRID_ROLES, {"FQ_INT8_ONCE": 1}),
    ],
    ids=["8B", "8B-once", "tiny-hybrid-once"],
)
def test_int8_x_compiles(tmp_path, shapes, layers, int8, roles, knobs, maxm, head_mode):
    """FQ_INT8's dot products (K-quant factors of 4 and 6 bits by dp4a, other formats on
    float x beside them) and its staged passes: on the 8B's verify, 8 rows of its MLP's
    14,336 a pass in 128 KB of staged x, all 16 rows of 4,096 at once; on the hybrid its
    in_proj phase too; with FQ_INT8_ONCE, o's and down's x rounded by the attention and by
    gate_up's blocks. The builds keep their registers and fit a launch."""
    tuning = fs.tuning_for(_layer_bytes(shapes), shapes.qk_norm, shapes.linear is not None)
    tuning |= {"FQ_INT8": int8, "FQ_VERIFY_SMEM_X": 32768 if maxm > 1 else 0} | knobs
    formats = tuple(sorted({f for role in roles for f in role}))
    source = _step_source(shapes, layers, "__nv_bfloat16", head_mode, maxm=maxm,
                          formats=formats, tuning=tuning, roles=roles)  # fmt: skip
    assert f"#define FQ_INT8 {int8}" in source
    log = _nvcc(tmp_path, source)
    assert _fits_a_launch(log, tuning, maxm > 1), log[-3000:]
    if shapes.linear is None:
        assert _keeps_registers(log) or max(_spills(log)) <= 96, log[-3000:]


@needs_nvcc
@pytest.mark.parametrize("maxm,head_mode", BUILDS)
def test_int8_x_in_the_normed_phases_only_compiles(tmp_path, maxm, head_mode):
    """FQ_INT8_RESIDUAL=0 on the 8B: qkv, gate_up and the head over int8 x, o and down over
    float x, in one build; the step's and the 8-row verify's keep their registers (the verify
    needs no more staged x than float's: its 14,336-long rows stay float)."""
    tuning = fs.tuning_for(_layer_bytes(LLAMA_8B), LLAMA_8B.qk_norm)
    tuning |= {"FQ_INT8": 2048, "FQ_INT8_RESIDUAL": 0}
    source = _step_source(LLAMA_8B, 2, "__nv_bfloat16", head_mode, maxm=maxm,
                          formats=(68, 134), tuning=tuning, roles=KFACTORS)  # fmt: skip
    assert "#define FQ_INT8_RESIDUAL 0" in source
    log = _nvcc(tmp_path, source)
    assert _fits_a_launch(log, tuning, maxm > 1), log[-3000:]
    assert _keeps_registers(log) or max(_spills(log)) <= 96, log[-3000:]
