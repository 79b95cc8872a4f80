"""Gated DeltaNet kernels (numpy and MLX) against the float64 references in
kernels.gated_delta_ref."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import gated_delta as gd
from kernels import gated_delta_cuda
from kernels import gated_delta_mlx as gdm
from kernels import gated_delta_ref as ref

TOL = 1e-4
H, DK, DV = 4, 32, 48

Inputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def make_inputs(L: int, seed: int = 0, repeated_keys: bool = False) -> Inputs:
    """Realistic GDN inputs: unit q/k (q scaled by Dk**-0.5), g = -softplus, beta = sigmoid."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((L, H, DK)).astype(np.float32)
    k = rng.standard_normal((L, H, DK)).astype(np.float32)
    if repeated_keys:  # the worst case for the chunk's triangular solve
        k[:] = k[:1]
    q = q / np.linalg.norm(q, axis=-1, keepdims=True) * DK**-0.5
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((L, H, DV)).astype(np.float32)
    g = -np.logaddexp(0.0, rng.standard_normal((L, H)) * 1.5).astype(np.float32)
    beta = (1.0 / (1.0 + np.exp(-rng.standard_normal((L, H))))).astype(np.float32)
    if repeated_keys:
        g[:] = -1e-3
        beta[:] = 0.999
    state = (rng.standard_normal((H, DK, DV)) * 0.5).astype(np.float32)
    return q, k, v, g, beta, state


def to_mx(args: Sequence[np.ndarray]) -> list[mx.array]:
    return [mx.array(a) for a in args]


def max_diff(a: np.ndarray | mx.array, b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - b), initial=0.0))


Kernel = Callable[..., tuple[np.ndarray, np.ndarray]]

NUMPY_KERNELS: dict[str, Kernel] = {
    "recurrent": gd.gated_delta_recurrent,
    "chunked": gd.gated_delta_chunked,
    "chunked24": partial(gd.gated_delta_chunked, chunk=24),  # non-power-of-two chunks
}
MLX_KERNELS: dict[str, Callable[..., tuple[mx.array, mx.array]]] = {
    "recurrent": gdm.gated_delta_recurrent,
    "chunked": gdm.gated_delta_chunked,
    "chunked24": partial(gdm.gated_delta_chunked, chunk=24),
}


# --- gated delta rule: kernels vs reference -------------------------------------------------


@pytest.mark.parametrize("name", list(NUMPY_KERNELS))
@pytest.mark.parametrize("L", [1, 7, 64, 65, 200])
def test_numpy_kernel_matches_reference(name: str, L: int) -> None:
    args = make_inputs(L, seed=L)
    o_ref, s_ref = ref.gated_delta_reference(*args)
    o, s = NUMPY_KERNELS[name](*args)
    assert o.shape == (L, H, DV) and s.shape == (H, DK, DV)
    assert o.dtype == np.float32 and s.dtype == np.float32
    assert max_diff(o, o_ref) <= TOL
    assert max_diff(s, s_ref) <= TOL


@pytest.mark.parametrize("name", list(MLX_KERNELS))
@pytest.mark.parametrize("L", [1, 7, 64, 65, 200])
def test_mlx_kernel_matches_reference(name: str, L: int) -> None:
    args = make_inputs(L, seed=L)
    o_ref, s_ref = ref.gated_delta_reference(*args)
    o, s = MLX_KERNELS[name](*to_mx(args))
    assert o.shape == (L, H, DV) and s.shape == (H, DK, DV)
    assert max_diff(o, o_ref) <= TOL
    assert max_diff(s, s_ref) <= TOL


@pytest.mark.parametrize("repeated_keys", [False, True])
def test_chunked_long_sequence(repeated_keys: bool) -> None:
    args = make_inputs(300, seed=3, repeated_keys=repeated_keys)
    o_ref, s_ref = ref.gated_delta_reference(*args)
    for o, s in (gd.gated_delta_chunked(*args), gdm.gated_delta_chunked(*to_mx(args))):
        assert max_diff(o, o_ref) <= TOL
        assert max_diff(s, s_ref) <= TOL


def test_strong_decay_does_not_overflow() -> None:
    q, k, v, _, beta, state = make_inputs(130, seed=4)
    g = np.full((130, H), -40.0, dtype=np.float32)  # cumulative decay far below float32's range
    o_ref, s_ref = ref.gated_delta_reference(q, k, v, g, beta, state)
    o, s = gd.gated_delta_chunked(q, k, v, g, beta, state)
    assert np.isfinite(o).all() and np.isfinite(s).all()
    assert max_diff(o, o_ref) <= TOL and max_diff(s, s_ref) <= TOL


def test_empty_input_returns_state_copy() -> None:
    q, k, v, g, beta, state = make_inputs(0)
    for kernel in (gd.gated_delta_recurrent, gd.gated_delta_chunked):
        o, s = kernel(q, k, v, g, beta, state)
        assert o.shape == (0, H, DV)
        np.testing.assert_array_equal(s, state)
        assert not np.shares_memory(s, state)


# --- state carry and tape replay ------------------------------------------------------------


def split_rows(args: Inputs, start: int, stop: int) -> list[np.ndarray]:
    return [a[start:stop] for a in args[:5]]


@pytest.mark.parametrize("L1, L2", [(64, 64), (50, 100), (1, 130)])
def test_chunked_carries_state_across_calls(L1: int, L2: int) -> None:
    args = make_inputs(L1 + L2, seed=5)
    o_all, s_all = gd.gated_delta_chunked(*args)
    o1, s1 = gd.gated_delta_chunked(*split_rows(args, 0, L1), args[5])
    o2, s2 = gd.gated_delta_chunked(*split_rows(args, L1, L1 + L2), s1)
    assert max_diff(np.concatenate([o1, o2]), o_all.astype(np.float64)) <= TOL
    assert max_diff(s2, s_all.astype(np.float64)) <= TOL

    m_all, ms_all = gdm.gated_delta_chunked(*to_mx(args))
    m1, ms1 = gdm.gated_delta_chunked(*to_mx(split_rows(args, 0, L1)), mx.array(args[5]))
    m2, ms2 = gdm.gated_delta_chunked(*to_mx(split_rows(args, L1, L1 + L2)), ms1)
    assert max_diff(mx.concatenate([m1, m2]), np.array(m_all, dtype=np.float64)) <= TOL
    assert max_diff(ms2, np.array(ms_all, dtype=np.float64)) <= TOL


REPLAY_ARGS = make_inputs(96, seed=6)
REPLAY_FULL = gd.gated_delta_chunked(*REPLAY_ARGS)


@settings(max_examples=30, deadline=None)
@given(num_rows=st.integers(min_value=0, max_value=96))
def test_replay_from_saved_state_matches_longer_run(num_rows: int) -> None:
    """Tape replay: recurrent over rows[:k] from the saved state == the long run's first k
    rows, and continuing from the replayed state gives the rest of the long run."""
    o_full, s_full = REPLAY_FULL
    saved = REPLAY_ARGS[5]
    o_head, s_head = gd.gated_delta_recurrent(*split_rows(REPLAY_ARGS, 0, num_rows), saved)
    assert max_diff(o_head, o_full[:num_rows].astype(np.float64)) <= TOL
    o_tail, s_tail = gd.gated_delta_chunked(*split_rows(REPLAY_ARGS, num_rows, 96), s_head)
    assert max_diff(o_tail, o_full[num_rows:].astype(np.float64)) <= TOL
    assert max_diff(s_tail, s_full.astype(np.float64)) <= TOL


@settings(max_examples=8, deadline=None)
@given(num_rows=st.integers(min_value=1, max_value=16))
def test_mlx_replay_matches_longer_run(num_rows: int) -> None:
    args = to_mx(REPLAY_ARGS)
    o_full, _ = REPLAY_FULL
    o_head, _ = gdm.gated_delta_recurrent(*[a[:num_rows] for a in args[:5]], args[5])
    assert max_diff(o_head, o_full[:num_rows].astype(np.float64)) <= TOL


# --- purity -----------------------------------------------------------------------------------


def test_numpy_kernels_do_not_mutate_inputs() -> None:
    args = make_inputs(70, seed=7)
    before = [a.copy() for a in args]
    kernels = [ref.gated_delta_reference, gd.gated_delta_recurrent, gd.gated_delta_chunked]
    for kernel in kernels:
        _, s = kernel(*args)
        assert not np.shares_memory(s, args[5])
        for a, b in zip(args, before, strict=True):
            np.testing.assert_array_equal(a, b)

    x, weight, conv_state = make_conv_inputs(9, seed=7)
    conv_before = [a.copy() for a in (x, weight, conv_state)]
    for conv in (gd.causal_conv1d, ref.causal_conv1d_reference):
        _, new_state = conv(x, weight, conv_state)
        assert not np.shares_memory(new_state, conv_state)
    assert not np.shares_memory(gd.conv_state_after(conv_state, x), conv_state)
    for a, b in zip((x, weight, conv_state), conv_before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_mlx_kernels_leave_state_unchanged() -> None:
    args = to_mx(make_inputs(20, seed=8))
    state_before = np.array(args[5])
    for kernel in (gdm.gated_delta_recurrent, gdm.gated_delta_chunked):
        mx.eval(kernel(*args))
        np.testing.assert_array_equal(np.array(args[5]), state_before)


# --- causal conv1d ----------------------------------------------------------------------------


def make_conv_inputs(
    L: int, C: int = 24, K: int = 4, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((L, C)).astype(np.float32)
    weight = rng.standard_normal((C, K)).astype(np.float32)
    conv_state = rng.standard_normal((K - 1, C)).astype(np.float32)
    return x, weight, conv_state


@pytest.mark.parametrize("L, K", [(1, 4), (3, 4), (50, 4), (10, 1)])
def test_conv1d_matches_reference(L: int, K: int) -> None:
    x, weight, conv_state = make_conv_inputs(L, K=K, seed=L)
    y_ref, state_ref = ref.causal_conv1d_reference(x, weight, conv_state)
    for y, state in (
        gd.causal_conv1d(x, weight, conv_state),
        gdm.causal_conv1d(*to_mx((x, weight, conv_state))),
    ):
        assert y.shape == (L, 24) and state.shape == (K - 1, 24)
        assert max_diff(y, y_ref) <= 1e-5
        assert max_diff(state, state_ref) == 0.0


@pytest.mark.parametrize("backend", [gd, gdm])
def test_conv1d_streaming_equals_one_shot(backend: object) -> None:
    x, weight, _ = make_conv_inputs(40, seed=9)
    zeros = np.zeros((3, 24), dtype=np.float32)
    convert = np.asarray if backend is gd else mx.array
    conv: Callable[..., tuple[np.ndarray, np.ndarray]] = backend.causal_conv1d  # type: ignore[attr-defined]
    after: Callable[..., np.ndarray] = backend.conv_state_after  # type: ignore[attr-defined]

    y_all, state_all = conv(convert(x), convert(weight), convert(zeros))
    state = convert(zeros)
    pieces = []
    for start, stop in [(0, 1), (1, 2), (2, 9), (9, 40)]:
        rows = convert(x[start:stop])
        y, new_state = conv(rows, convert(weight), state)
        assert max_diff(after(state, rows), np.array(new_state, dtype=np.float64)) == 0.0
        pieces.append(np.array(y))
        state = new_state
    assert max_diff(np.concatenate(pieces), np.array(y_all, dtype=np.float64)) <= 1e-6
    assert max_diff(state, np.array(state_all, dtype=np.float64)) == 0.0


# --- low precision (MLX) ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_mlx_accepts_low_precision(dtype: mx.Dtype) -> None:
    args = make_inputs(70, seed=10)
    o_ref, _ = ref.gated_delta_reference(*args)
    low = [a.astype(dtype) for a in to_mx(args)]
    for kernel in (gdm.gated_delta_recurrent, gdm.gated_delta_chunked):
        o, s = kernel(*low)
        assert o.dtype == dtype and s.dtype == mx.float32
        o32 = np.array(o.astype(mx.float32))
        assert np.isfinite(o32).all() and np.isfinite(np.array(s)).all()
        assert max_diff(o32, o_ref) <= 0.05  # bf16 inputs: only a coarse agreement

    x, weight, conv_state = make_conv_inputs(12, seed=10)
    y, new_state = gdm.causal_conv1d(*[a.astype(dtype) for a in to_mx((x, weight, conv_state))])
    assert y.dtype == dtype and new_state.dtype == dtype
    assert np.isfinite(np.array(y.astype(mx.float32))).all()


@pytest.mark.skipif(not gated_delta_cuda.is_available(), reason="needs MLX on a CUDA GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("pair", [1, 2])
@pytest.mark.parametrize("L", [1, 7, 16])
def test_cuda_recurrent_kernel_matches_reference_and_replays(monkeypatch, pair: int, L: int):
    """The one-launch CUDA recurrence, its value columns one thread each or two (PAIR):
    within the float32 tolerance of the reference, and rows folded in two calls give the
    state of one call bit for bit (a verify tape's replay)."""
    monkeypatch.setattr(gated_delta_cuda, "PAIR", pair)
    args = make_inputs(L, seed=L)
    o_ref, s_ref = ref.gated_delta_reference(*args)
    o, s = gated_delta_cuda.gated_delta_recurrent(*to_mx(args))
    assert max_diff(o, o_ref) <= TOL and max_diff(s, s_ref) <= TOL
    cut = L // 2
    q, k, v, g, beta, state = to_mx(args)
    _, s1 = gated_delta_cuda.gated_delta_recurrent(
        q[:cut], k[:cut], v[:cut], g[:cut], beta[:cut], state
    )
    _, s2 = gated_delta_cuda.gated_delta_recurrent(
        q[cut:], k[cut:], v[cut:], g[cut:], beta[cut:], s1
    )
    np.testing.assert_array_equal(np.array(s2), np.array(s))
