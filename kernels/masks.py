"""Masks `Ops.attention` takes besides a bool [L, S] array."""

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
