"""A sliding-window layer's ring (engine/sliding_kv.py) written a chunk at a time: each
chunk's surviving rows go in as one span of slots, or two where the ring wraps, on both
op sets, and every slot then holds the row of the position it names."""

from __future__ import annotations

import numpy as np
import pytest

from engine.state import SlidingKV
from kernels.ops_mlx import MlxOps
from kernels.ops_numpy import NumpyOps

HEADS, DIM, WINDOW, SLACK = 2, 3, 5, 3  # a ring of 8 slots
CHUNKS = [3, 7, 12, 1, 6, 8, 2, 9]  # within the ring, wrapping it, longer than it


def _row(position: int) -> np.ndarray:
    """Keys of `position` [HEADS, DIM] (values: the negation), distinct for every position."""
    return position + np.arange(HEADS * DIM, dtype=np.float32).reshape(HEADS, DIM) / 16


@pytest.mark.parametrize("ops", [NumpyOps(kv_dtype="float32"), MlxOps(dtype="float32")])
def test_every_slot_holds_the_row_of_its_position(ops, monkeypatch):
    ring = SlidingKV(ops, HEADS, DIM, WINDOW, SLACK)
    writes: list[int] = []
    original = ops.write_rows

    def counted(buf, start, rows):
        writes.append(int(rows.shape[1]))
        return original(buf, start, rows)

    monkeypatch.setattr(ops, "write_rows", counted)
    position = 0
    for n in CHUNKS:
        keys = np.stack([_row(p) for p in range(position, position + n)], axis=1)
        k, v = ops.asarray(keys), ops.asarray(-keys)
        ring.append(k, v)
        writes.clear()
        ring.end_forward()
        position += n
        survivors = min(n, ring.size)
        assert sum(writes) == 2 * survivors and len(writes) <= 4  # keys and values
        held = sorted(int(p) for p in ring.positions if p >= 0)
        assert held == list(range(max(0, position - ring.size), position))
        got_k = np.asarray(ops.to_numpy(ring.keys), np.float32)
        got_v = np.asarray(ops.to_numpy(ring.values), np.float32)
        for slot, p in enumerate(ring.positions):
            if p >= 0:
                assert slot == p % ring.size
                np.testing.assert_array_equal(got_k[:, slot], _row(int(p)))
                np.testing.assert_array_equal(got_v[:, slot], -_row(int(p)))
