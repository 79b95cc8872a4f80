"""A sliding window's attention over its ring as the C step computes it
(kernels.qmatmul.ring_attention: attention.c's blocks over keys by position), on each code
path the build has: against a float64 reference of windowed attention, and row for row
the same bits whether a position comes in a prefill piece, a verify or a decode step."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from kernels import qmatmul, qmatmul_ref

pytestmark = pytest.mark.skipif(
    not qmatmul.available(), reason="kernels._qmatmul is not built (pip install -e . builds it)"
)

TOL = 2e-5  # float32 accumulation over a window of <= 512 keys, relative to the output
SHAPES = [(4, 1, 256), (9, 3, 64), (6, 2, 12)]  # Hq, Hkv, D: Gemma 3, the default model, odd


@pytest.fixture(params=[1, 2])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    qmatmul.set_num_threads(request.param)
    yield request.param
    qmatmul.set_num_threads(qmatmul.default_num_threads())


class Ring:
    """A ring of `size` slots as engine/sliding_kv.py keeps it: position p in slot p % size,
    `positions` saying which; slots never written hold NaN, which no row may read."""

    def __init__(self, Hkv: int, size: int, D: int, dtype: type) -> None:
        self.keys = np.full((Hkv, size, D), np.nan, dtype=dtype)
        self.values = np.full((Hkv, size, D), np.nan, dtype=dtype)
        self.positions = np.full(size, -1, dtype=np.int64)

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> None:
        size = self.positions.size
        for j in range(k.shape[1]):
            slot = (start + j) % size
            self.keys[:, slot], self.values[:, slot] = k[:, j], v[:, j]
            self.positions[slot] = start + j

    def parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.keys, self.values, self.positions


def rows(Hkv: int, n: int, D: int, dtype: type, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((Hkv, n, D)).astype(dtype)
    return k, rng.standard_normal((Hkv, n, D)).astype(dtype)


def filled_ring(Hkv: int, size: int, D: int, dtype: type, length: int) -> Ring:
    """A ring after positions [0, length) were written (the newest `size` survive)."""
    ring = Ring(Hkv, size, D, dtype)
    k, v = rows(Hkv, length, D, dtype, seed=length)
    ring.write(0, k, v)
    return ring


def reference(
    q: np.ndarray, ring: Ring, new: tuple[np.ndarray, np.ndarray], offset: int, window: int
) -> np.ndarray:
    """float64: row l over the keys (pos - window, pos] the ring holds or the call brought."""
    Hq, L, D = q.shape
    size = ring.positions.size
    out = np.zeros((Hq, L, D))
    for l in range(L):
        pos = offset + l
        seen = [
            p
            for p in range(max(0, pos - window + 1), pos + 1)
            if p >= offset or ring.positions[p % size] == p
        ]
        if not seen:
            continue
        k = np.stack(
            [new[0][:, p - offset] if p >= offset else ring.keys[:, p % size] for p in seen], 1
        )
        v = np.stack(
            [new[1][:, p - offset] if p >= offset else ring.values[:, p % size] for p in seen], 1
        )
        out[:, l : l + 1] = qmatmul_ref.attention_reference(q[:, l : l + 1], k, v, D**-0.5, None)
    return out


# (window, ring size, rows, offset): below the window, at its edges, ring wrapped; one row
# and many; a window far smaller than a 64-key block, its ring wrapping inside each block
CASES = [
    (512, 520, 1, 0),
    (512, 520, 1, 300),
    (512, 520, 1, 511),
    (512, 520, 1, 512),
    (512, 520, 8, 509),
    (512, 520, 1, 2000),
    (512, 520, 64, 0),
    (512, 520, 64, 480),
    (512, 520, 64, 1000),
    (512, 520, 37, 1031),
    (8, 12, 1, 100),
    (8, 12, 20, 50),
]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("Hq,Hkv,D", SHAPES)
@pytest.mark.parametrize("window,size,L,offset", CASES)
def test_matches_the_float64_reference(
    code_path, threads, dtype, Hq, Hkv, D, window, size, L, offset
) -> None:
    ring = filled_ring(Hkv, size, D, dtype, offset)
    new = rows(Hkv, L, D, dtype, seed=offset + 1)
    q = np.random.default_rng(L).standard_normal((Hq, L, D)).astype(np.float32)
    got = qmatmul.ring_attention(q, ring.parts(), new, offset, window, D**-0.5)
    want = reference(q, ring, new, offset, window)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL * float(np.abs(want).max()))


def test_slots_the_ring_no_longer_holds_are_not_seen(code_path) -> None:
    """A slot whose position is not the key's (a snapshot from before it was written, or a
    rewound one) is masked as the Python path masks it: NaN there changes nothing."""
    Hq, Hkv, D, window, size, offset = 4, 1, 256, 512, 520, 700
    ring = filled_ring(Hkv, size, D, np.float16, offset)
    gone = np.random.default_rng(3).choice(size, 40, replace=False)
    ring.positions[gone] = -1
    ring.keys[:, gone], ring.values[:, gone] = np.nan, np.inf
    new = rows(Hkv, 5, D, np.float16, seed=9)
    q = np.random.default_rng(4).standard_normal((Hq, 5, D)).astype(np.float32)
    got = qmatmul.ring_attention(q, ring.parts(), new, offset, window, D**-0.5)
    want = reference(q, ring, new, offset, window)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL * float(np.abs(want).max()))


def run_schedule(
    pieces: list[int], Hq: int, Hkv: int, D: int, window: int, size: int
) -> np.ndarray:
    """Positions [0, sum(pieces)) fed in pieces, each piece's rows written into the ring
    after its call (as SlidingKV.end_forward does): out [Hq, positions, D]."""
    total = sum(pieces)
    q = np.random.default_rng(0).standard_normal((Hq, total, D)).astype(np.float32)
    k, v = rows(Hkv, total, D, np.float16, seed=1)
    ring, outs, start = Ring(Hkv, size, D, np.float16), [], 0
    for n in pieces:
        piece = (
            np.ascontiguousarray(k[:, start : start + n]),
            np.ascontiguousarray(v[:, start : start + n]),
        )
        outs.append(
            qmatmul.ring_attention(
                q[:, start : start + n], ring.parts(), piece, start, window, D**-0.5
            )
        )
        ring.write(start, *piece)
        start += n
    return np.concatenate(outs, axis=1)


@pytest.mark.parametrize("Hq,Hkv,D", SHAPES[:2])
def test_a_position_is_the_same_bits_in_prefill_pieces_verifies_and_decode_steps(
    code_path, Hq, Hkv, D
) -> None:
    """700 positions through a window-512 ring of 520 (wrapped past 520): 64-row prefill
    pieces on one thread equal 8-row verifies, single decode steps and an uneven mix on
    two, bit for bit (blocks of absolute positions, whichever rows came along)."""
    window, size = 512, 520
    qmatmul.set_num_threads(1)
    try:
        want = run_schedule([64] * 10 + [60], Hq, Hkv, D, window, size)
    finally:
        qmatmul.set_num_threads(qmatmul.default_num_threads())
    qmatmul.set_num_threads(2)
    try:
        for pieces in ([8] * 87 + [4], [1] * 700, [13, 64, 1, 50, 7, 64, 64, 3, *[64] * 5, 58, 56]):
            assert sum(pieces) == 700
            np.testing.assert_array_equal(run_schedule(pieces, Hq, Hkv, D, window, size), want)
    finally:
        qmatmul.set_num_threads(qmatmul.default_num_threads())


def test_bad_arguments_raise() -> None:
    ring = Ring(1, 16, 8, np.float32)
    new = rows(1, 2, 8, np.float32, seed=0)
    q = np.zeros((2, 2, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="disagree"):
        qmatmul.ring_attention(q, ring.parts(), (new[0].astype(np.float16), new[1]), 4, 8, 0.5)
    with pytest.raises(ValueError, match="disagree"):
        qmatmul.ring_attention(q, ring.parts(), new, 4, 0, 0.5)
    with pytest.raises(ValueError, match="disagree"):
        qmatmul.ring_attention(q[:, :1], ring.parts(), new, 4, 8, 0.5)
