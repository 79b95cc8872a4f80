"""A fused projection whose parts are quantized differently (Gemma 3 270M's Q4_K_M: Q5_0 q
and k, Q8_0 v; Llama's Q4_K_M: Q6_K beside Q4_K) stays packed, as `RowParts`, on both
backends: its matmul gives the separate matmuls' numbers bit for bit, its embedding rows
and bytes are its parts', and the real Gemma's logits are the dense copy's to float32
rounding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from engine.config import EngineConfig
from engine.loader import LoadedModel, load_model
from engine.model_catalog import GEMMA3_270M
from kernels import qmatmul
from kernels.ops_mlx import MlxOps
from kernels.ops_numpy import NumpyOps
from kernels.qmatmul import QMatrix
from kernels.quantized import QuantizedWeight
from kernels.row_parts import RowParts
from tests.tiny_models import make_llama_gguf
from tests.tolerances import FLOAT32_ATOL, engine_config, host

# The packed weights here are the float kernel's QMatrix (cpu_matmul="float"): these tests
# hold its parts to the dense copy's numbers at FLOAT32_ATOL; the int8 kernel's RowParts are
# tested in tests/kernels/test_int8_matmul.py.

needs_kernel = pytest.mark.skipif(not qmatmul.available(), reason="kernels._qmatmul is not built")

K = 64
# (rows, bits, group size) of q, k, v; None: a dense float part (an F32 tensor)
LAYOUTS = {
    "gemma3_q5_q5_q8": [(64, 5, 32), (16, 5, 32), (16, 8, 32)],
    "llama_q4_q4_q6k": [(64, 4, 32), (16, 4, 32), (16, 6, 16)],
    "q4_dense_q8": [(64, 4, 32), (16, None, 0), (16, 8, 32)],
}


def make_part(rows: int, bits: int | None, group_size: int, seed: int, lib: str) -> object:
    """A random QuantizedWeight (float16-exact factors, as GGUF's) or a float32 matrix."""
    rng = np.random.default_rng(seed)
    if bits is None:
        w = rng.standard_normal((rows, K)).astype(np.float32)
        return w if lib == "numpy" else mx.array(w)
    words = rng.integers(0, 2**32, (rows, K * bits // 32), dtype=np.uint64).astype(np.uint32)
    scales = (rng.standard_normal((rows, K // group_size)) * 0.02).astype(np.float16)
    biases = (rng.standard_normal((rows, K // group_size)) * 0.1).astype(np.float16)
    arrays = [words, scales.astype(np.float32), biases.astype(np.float32)]
    if lib == "mlx":
        arrays = [mx.array(a) for a in arrays]
    return QuantizedWeight(*arrays, group_size, bits)


def parts_of(layout: str, lib: str) -> list[object]:
    return [make_part(*spec, seed=i, lib=lib) for i, spec in enumerate(LAYOUTS[layout])]


def rows_x(m: int) -> np.ndarray:
    return np.random.default_rng(m).standard_normal((m, K)).astype(np.float32)


# -- NumPy ------------------------------------------------------------------------------


@needs_kernel
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_numpy_keeps_mixed_parts_packed(layout: str) -> None:
    ops = NumpyOps(packed=True, cpu_matmul="float")
    weights = [ops.weight(w) for w in parts_of(layout, "numpy")]
    fused = ops.concat_weights(weights)
    assert isinstance(fused, RowParts) and fused.shape == (96, K)
    if layout == "q4_dense_q8":  # nothing of one kind side by side: three parts
        assert [type(p) for p in fused.parts] == [QMatrix, np.ndarray, QMatrix]
    else:  # q|k joined into one packed matrix, v beside it
        assert fused.rows == (80, 16) and all(isinstance(p, QMatrix) for p in fused.parts)
    assert ops.nbytes(fused) == sum(int(w.nbytes) for w in weights)
    dense = NumpyOps(packed=False).concat_weights(
        [NumpyOps(packed=False).weight(w) for w in parts_of(layout, "numpy")]
    )
    if layout != "q4_dense_q8":
        assert 4 * ops.nbytes(fused) < dense.nbytes


@needs_kernel
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("m", [1, 3, 8, qmatmul.KERNEL_MAX_ROWS, qmatmul.KERNEL_MAX_ROWS + 1, 150])
def test_numpy_matmul_is_the_separate_matmuls(layout: str, m: int) -> None:
    """Bit for bit the parts' own matmuls, on the kernel's rows (a decode row written in
    place, a verify's copied) and on BLAS's (a prefill, dequantized a block at a time).
    The kernel's columns do not depend on their neighbours, so up to KERNEL_MAX_ROWS rows
    that is q, k and v apart too; BLAS's can (OpenBLAS picks kernels by shape), so a
    prefill's joined q|k is theirs to float32 rounding, as for any fused projection."""
    ops, dense_ops = NumpyOps(packed=True, cpu_matmul="float"), NumpyOps(packed=False)
    weights = [ops.weight(w) for w in parts_of(layout, "numpy")]
    fused = ops.concat_weights(weights)
    x = rows_x(m)
    got = ops.linear(x, fused)
    assert isinstance(fused, RowParts) and got.dtype == np.float32
    assert np.array_equal(got, np.concatenate([ops.linear(x, p) for p in fused.parts], axis=1))
    apart = np.concatenate([ops.linear(x, w) for w in weights], axis=1)
    if m <= qmatmul.KERNEL_MAX_ROWS:
        assert np.array_equal(got, apart)
    dense = dense_ops.concat_weights([dense_ops.weight(w) for w in parts_of(layout, "numpy")])
    want = x.astype(np.float64) @ dense.astype(np.float64)
    for y in (got, apart):
        np.testing.assert_allclose(y, want, rtol=0, atol=1e-5 * np.abs(want).max())


@needs_kernel
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_numpy_embed_rows_across_parts(layout: str) -> None:
    ops, dense_ops = NumpyOps(packed=True, cpu_matmul="float"), NumpyOps(packed=False)
    fused = ops.concat_weights([ops.weight(w) for w in parts_of(layout, "numpy")])
    dense = dense_ops.concat_weights([dense_ops.weight(w) for w in parts_of(layout, "numpy")])
    ids = np.array([95, 0, 80, 79, 3, 95, 64, 81])  # every part, out of order, repeated
    assert np.array_equal(ops.embed(fused, ids), dense_ops.embed(dense, ids))
    with pytest.raises(IndexError):
        ops.embed(fused, np.array([96]))


@needs_kernel
def test_matmul_into_checks_its_output() -> None:
    qm = NumpyOps(packed=True, cpu_matmul="float").weight(make_part(16, 8, 32, 0, "numpy"))
    x = rows_x(2)
    wide = np.full((2, 40), np.nan, np.float32)
    assert qmatmul.matmul(x, qm, out=wide[:, 8:24]) is not None
    assert np.array_equal(wide[:, 8:24], qmatmul.matmul(x, qm))
    assert np.isnan(wide[:, :8]).all() and np.isnan(wide[:, 24:]).all()
    with pytest.raises(ValueError, match="out must be"):
        qmatmul.matmul(x, qm, out=wide[:, :15])


def test_row_parts_refuse_bad_shapes() -> None:
    with pytest.raises(ValueError, match="two or more"):
        RowParts((np.zeros((4, 4)),), (4,), 4)
    with pytest.raises(ValueError, match="positive"):
        RowParts((np.zeros((4, 4)), np.zeros((4, 0))), (4, 0), 4)


# -- MLX --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("m", [1, 5, 40])
def test_mlx_matmul_is_the_separate_matmuls(layout: str, dtype: str, m: int) -> None:
    ops = MlxOps(dtype)
    weights = [ops.weight(w) for w in parts_of(layout, "mlx")]
    fused = ops.concat_weights(weights)
    assert isinstance(fused, RowParts) and fused.shape == (96, K)
    # MLX has no groups of 16: Q6_K's v is dense; the rest stays quantized
    num_quantized = sum(isinstance(p, QuantizedWeight) for p in fused.parts)
    assert num_quantized == {"gemma3_q5_q5_q8": 2, "llama_q4_q4_q6k": 1, "q4_dense_q8": 2}[layout]
    assert ops.nbytes(fused) == sum(int(w.nbytes) for w in weights)
    x = ops.asarray(rows_x(m))
    got = host(ops.linear(x, fused))
    separate = host(mx.concatenate([ops.linear(x, w) for w in weights], axis=-1))
    assert np.array_equal(got, separate)
    if dtype == "float32":  # and the numbers of the dense copy the fused CUDA path stacks
        want = host(x @ ops._dense(fused).T)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mlx_embed_rows_across_parts(layout: str) -> None:
    ops = MlxOps("float32")
    fused = ops.concat_weights([ops.weight(w) for w in parts_of(layout, "mlx")])
    ids = np.array([95, 0, 80, 79, 3, 95, 64, 81])
    dense = ops._dense(fused)
    assert dense.shape == (96, K)
    assert np.array_equal(host(ops.embed(fused, ids)), host(dense[mx.array(ids)]))
    assert np.array_equal(host(ops.embed(fused, mx.array(ids))), host(dense[mx.array(ids)]))


# -- models -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama GGUF whose layer 0 has Q4_1 q and k beside an F32 v."""
    path = tmp_path_factory.mktemp("mixed") / "mixed.gguf"
    v = np.random.default_rng(7).standard_normal((32, 64)).astype(np.float32) * 0.05
    make_llama_gguf(path, qtype="Q4_1", embed_qtype="Q8_0", replace={"blk.0.attn_v.weight": v})
    return path


PROMPT = list(range(3, 40))


def _logits(lm: LoadedModel, steps: list[int]) -> list[np.ndarray]:
    state = lm.runner.new_state()
    out = [lm.ops.to_numpy(lm.runner.forward(PROMPT, state))]
    out += [lm.ops.to_numpy(lm.runner.forward([t], state)) for t in steps]
    return [np.array(o) for o in out]


def test_mixed_model_on_every_path(mixed_llama: Path) -> None:
    """Packed NumPy, dense NumPy, MLX and MLX's fused decode steps agree on a model whose
    layer 0 projection is parted."""
    steps = [5, 9, 33]
    # float32 arithmetic and float32 K/V on the NumPy side: what MLX float32 computes
    cpu = {"backend": "numpy", "kv_dtype": "float32"}
    packed = load_model(mixed_llama, EngineConfig(**cpu, cpu_matmul="float"))
    assert isinstance(packed.runner.model.layers[0].mixer.qkv.w, RowParts) == packed.ops.packed
    want = _logits(load_model(mixed_llama, EngineConfig(**cpu, qmatmul=False)), steps)
    mlx_lm = load_model(mixed_llama, EngineConfig(backend="mlx", dtype="float32"))
    mlx_lm.runner.fused = None
    assert isinstance(mlx_lm.runner.model.layers[0].mixer.qkv.w, RowParts)
    plain = _logits(mlx_lm, steps)
    mlx_lm.runner.enable_fused_decode(compiled=False, mode="layers")
    fused = _logits(mlx_lm, steps)
    for got in (_logits(packed, steps), plain):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=FLOAT32_ATOL)
    for a, b in zip(fused[1:], plain[1:], strict=True):  # the fused path takes the steps
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-4)


@pytest.mark.real_model
@needs_kernel
# K/V rows in float32: float16 ones round the two products' last-bit differences apart
# (1e-4 of the logits on AVX2, where the kernel's sums and OpenBLAS's differ the most)
@pytest.mark.parametrize("backend", ["numpy-float32", "mlx-float32"])
def test_real_gemma_logits_are_the_dense_copys(backend: str) -> None:
    """Gemma 3 270M Q4_K_M: the nine layers with a Q8_0 v keep q|k and v packed (numpy:
    109.9 -> 81.7 MB of layer weights), and the logits of a prefill through the kernel (20
    rows), one through numpy's BLAS (100 rows) and decode steps equal those of a dense q|k|v (what
    both backends held before) to float32 rounding."""
    path = GEMMA3_270M.path()
    if not path.is_file():
        pytest.skip("Gemma 3 270M is not downloaded (python -m engine fetch gemma3-270m)")
    lm = load_model(path, engine_config(backend))
    ops: Any = lm.ops
    if backend.startswith("numpy") and not ops.packed:
        pytest.skip("the numpy backend keeps nothing packed on this build")
    parted = [layer.mixer for layer in lm.runner.model.layers]
    parted = [mixer for mixer in parted if isinstance(mixer.qkv.w, RowParts)]
    assert len(parted) == 9
    assert all([p.bits for p in m.qkv.w.parts] == [5, 8] for m in parted)
    prompts = [[2, *range(1000, 1019)], [2, *range(3000, 3099)]]
    if not backend.startswith("numpy"):  # the 100 rows are for numpy's BLAS; MLX is slow here
        prompts = prompts[:1]

    def run() -> list[np.ndarray]:
        out = []
        for prompt in prompts:
            state = lm.runner.new_state()
            out.append(lm.runner.forward(prompt, state, logits="all"))
            out += [lm.runner.forward([t], state) for t in (506, 5279, 529)]
        return [np.array(ops.to_numpy(o)) for o in out]

    got = run()
    for mixer in parted:
        parts = mixer.qkv.w.parts
        if backend.startswith("numpy"):  # dense float32 [in, out]
            dense = np.concatenate([qmatmul.dequantize(p) for p in parts]).T
            mixer.qkv.w = np.ascontiguousarray(dense)
        else:
            mixer.qkv.w = ops._dense(mixer.qkv.w)
    want = run()
    for a, b in zip(got, want, strict=True):
        # the suite's float32 bound, for logits of magnitude ~10, scaled to these (~20);
        # measured: numpy at most 1.4e-5 (the kernel's sums against BLAS's), MLX 0
        assert np.abs(a - b).max() <= FLOAT32_ATOL * max(1.0, float(np.abs(b).max()) / 10)
        assert np.array_equal(np.argmax(a, axis=-1), np.argmax(b, axis=-1))
