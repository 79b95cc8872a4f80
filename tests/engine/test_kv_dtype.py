"""K/V rows in their own dtype (EngineConfig.kv_dtype): the setting parsed and refused where
it cannot be honoured, float16 buffers laid out as the C decode step writes them, each row
rounded once when written, and every copy (growth, branch-cache tails, ring snapshots)
keeping the rows bit for bit at half the bytes."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.kv_state import FullKV, dtype_name
from engine.loader import load_model
from engine.sliding_kv import SlidingKV
from kernels.ops import make_ops
from kernels.ops_numpy import NumpyOps
from tests.conftest import TinyModel

HEADS, DIM = 3, 8


def rows(seed: int, n: int) -> np.ndarray:
    """float32 [HEADS, n, DIM] rows that float16 cannot hold exactly."""
    return np.random.default_rng(seed).standard_normal((HEADS, n, DIM)).astype(np.float32)


def test_the_setting_from_the_environment_and_its_refusals() -> None:
    assert EngineConfig().kv_dtype is None  # float16 on the NumPy backend
    assert EngineConfig.from_environment({"BRANCHCHAT_KV_DTYPE": "float32"}).kv_dtype == "float32"
    with pytest.raises(ValueError, match="BRANCHCHAT_KV_DTYPE must be one of"):
        EngineConfig.from_environment({"BRANCHCHAT_KV_DTYPE": "int8"})
    with pytest.raises(ValueError, match="kv_dtype must be one of"):
        EngineConfig(kv_dtype="bfloat16")
    assert make_ops("numpy").kv_dtype == np.float16
    assert make_ops("numpy", kv_dtype="float32").kv_dtype == np.float32


def test_mlx_keeps_its_compute_dtype_and_refuses_another() -> None:
    assert dtype_name(make_ops("mlx", "float32", kv_dtype="float32").kv_dtype) == "float32"
    assert dtype_name(make_ops("mlx", "bfloat16").kv_dtype) == "bfloat16"
    with pytest.raises(ValueError, match=r"compute dtype \(bfloat16\).*kv_dtype='float16'"):
        make_ops("mlx", "bfloat16", kv_dtype="float16")


def test_rows_are_rounded_once_into_contiguous_float16_buffers() -> None:
    """What a C decode step relies on: keys / values are C-contiguous [Hkv, capacity, D]
    float16 arrays, and position p's row is [:, p], rounded as NumPy rounds float32."""
    kv = FullKV(NumpyOps(), HEADS, DIM)
    first, second = rows(0, 5), rows(1, 300)  # the second grows the buffer
    kv.append(first, first)
    keys, values, _mask = kv.append(second, -second)
    assert kv.keys.dtype == np.float16 and kv.keys.flags.c_contiguous
    assert kv.keys.shape == (HEADS, kv.capacity(), DIM) and kv.capacity() >= 305
    want = np.concatenate([first, second], axis=1).astype(np.float16)
    assert np.array_equal(keys, want) and keys.dtype == np.float16  # what attention reads
    assert np.array_equal(kv.arrays()["v"][:, 5:], (-second).astype(np.float16))
    assert kv.nbytes() == 2 * HEADS * kv.capacity() * DIM * 2  # half of float32's


def test_branch_cache_rows_round_trip_bit_for_bit() -> None:
    ops = NumpyOps()
    source, target = FullKV(ops, HEADS, DIM), FullKV(ops, HEADS, DIM)
    source.append(rows(2, 40), rows(3, 40))
    target.append(rows(2, 40)[:, :10], rows(3, 40)[:, :10])
    tail = source.copy_rows(10, 40)
    assert all(part.dtype == np.float16 for part in tail)
    assert source.rows_nbytes(10, 40) == 2 * HEADS * 30 * DIM * 2
    target.append_cached(tail, None, 30)
    for key in ("k", "v"):
        assert np.array_equal(target.arrays()[key], source.arrays()[key])


def test_a_ring_rounds_a_forwards_rows_before_attending() -> None:
    """A verify's later rows must see its earlier ones as a single step sees them in the
    ring: rounded. So the rows a chunk attends to are float16 already."""
    ring = SlidingKV(NumpyOps(), HEADS, DIM, window=4, slack=2)
    chunk = rows(4, 3)
    keys, values, _mask = ring.append(chunk, chunk)
    assert keys.dtype == values.dtype == np.float16
    assert np.array_equal(keys[:, ring.size :], chunk.astype(np.float16))
    ring.end_forward()
    snap = ring.snapshot()
    assert snap[0].dtype == np.float16 and ring.keys.dtype == np.float16
    ring.reset()
    assert ring.keys.dtype == np.float16 and not ring.keys.any()


def test_float32_rows_stay_float32_on_request() -> None:
    kv = FullKV(NumpyOps(kv_dtype="float32"), HEADS, DIM)
    chunk = rows(5, 7)
    keys, _values, _mask = kv.append(chunk, chunk)
    assert keys.dtype == np.float32 and np.array_equal(keys, chunk)


def test_the_fingerprint_tells_the_kv_dtypes_apart(tiny_llama_gguf: TinyModel) -> None:
    half = load_model(tiny_llama_gguf[0], EngineConfig(backend="numpy"))
    full = load_model(tiny_llama_gguf[0], EngineConfig(backend="numpy", kv_dtype="float32"))
    assert half.compute_path.startswith("numpy/float32/kv-float16/")
    assert "kv-" not in full.compute_path
    assert half.fingerprint != full.fingerprint


def test_growth_stops_at_the_context_length_unless_passed() -> None:
    kv = FullKV(NumpyOps(), HEADS, DIM, context_length=1000)
    for _ in range(5):  # 1000 rows in chunks of 200: 256, 512, then 768 -> 1024, not 1152
        kv.append(rows(6, 200), rows(7, 200))
    assert kv.capacity() == 1024
    kv.append(rows(8, 30), rows(9, 30))  # past the context: room all the same
    assert kv.length == 1030 and kv.capacity() >= 1030


def test_a_value_past_float16s_range_is_refused_not_stored_as_inf() -> None:
    kv = FullKV(NumpyOps(), HEADS, DIM)
    kv.append(rows(10, 4), rows(11, 4))
    huge = rows(12, 2)
    huge[1, 1, 3] = 7e4  # float16's largest is 65504
    with pytest.raises(FloatingPointError, match="exceeds float16's range.*KV_DTYPE=float32"):
        kv.append(huge, huge)
    assert kv.length == 4  # the rows before it stay; the refused ones lie past the cursor
    exact = FullKV(NumpyOps(kv_dtype="float32"), HEADS, DIM)
    keys, _values, _mask = exact.append(huge, huge)
    assert keys[1, 1, 3] == np.float32(7e4)
