"""Masks `Ops.attention` takes besides a bool [L, S] array: a full layer's causal one and a
sliding layer's window over its ring."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CausalMask:
    """The mask of query rows [start, start + rows) against keys [0, start + rows): a row
    sees its own position and every one before it. `Ops.attention` takes it in place of
    the bool [rows, S] array, so a backend may use its own causal form (MLX's "causal",
    aligned to the last key: on the H200 an array mask converted each layer cost ~0.65 ms a
    layer for 256 rows at 2k keys)."""

    start: int
    rows: int

    def array(self) -> np.ndarray:
        """bool [rows, start + rows], read-only (one array for every layer of a forward)."""
        return _causal_array(self.start, self.rows)


@functools.lru_cache(maxsize=4)
def _causal_array(start: int, rows: int) -> np.ndarray:
    mask = np.arange(start + rows)[None, :] <= np.arange(start, start + rows)[:, None]
    mask.flags.writeable = False
    return mask


@dataclass(frozen=True)
class WindowMask:
    """The mask of query rows at positions [start, start + rows) against keys at
    `positions` (a sliding ring's slots, then the call's rows; -1 marks an empty slot): a
    row sees the keys at its own position and the `window` - 1 before it (0: no window).
    Every sliding layer's ring holds the same positions, so a forward's layers hand
    `Ops.attention` equal masks and a backend builds it once for all of them (a bool
    [2,048, 2,576] array took 11 ms a layer in NumPy on the 2-core CPU, 15 layers in
    Gemma 3 270M; MLX builds it on the device)."""

    start: int
    rows: int
    window: int
    positions: bytes  # the keys' positions, int64, as bytes: hashable, compared by value

    @classmethod
    def of(cls, start: int, rows: int, positions: np.ndarray, window: int) -> WindowMask:
        keys = np.ascontiguousarray(positions, dtype=np.int64).tobytes()
        return cls(start, rows, window, keys)

    def key_positions(self) -> np.ndarray:
        return np.frombuffer(self.positions, dtype=np.int64)

    def array(self) -> np.ndarray:
        """bool [rows, len(positions)], read-only (one array for every layer of a forward)."""
        return _window_array(self)


@functools.lru_cache(maxsize=2)
def _window_array(mask: WindowMask) -> np.ndarray:
    keys = mask.key_positions()[None, :]
    queries = np.arange(mask.start, mask.start + mask.rows)[:, None]
    out = (keys <= queries) & (keys >= 0)
    if mask.window:
        out &= keys > queries - mask.window
    out.flags.writeable = False
    return out
