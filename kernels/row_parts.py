"""One weight held as the row blocks it was concatenated from, where they share no layout.

A fused projection (q|k|v, gate|up) is one matmul when its parts are quantized alike.
GGUF files often mix types inside one: Gemma 3 270M's Q4_K_M stores attn_q and attn_k as
Q5_0 but attn_v as Q8_0, Llama's Q4_K_M puts Q6_K beside Q4_K. One dense float32 copy of
such a projection reads ~5x the bytes of its packed parts every decode step, so each
backend keeps the parts as they are and multiplies them one by one into their columns
of one output (kernels/ops_numpy.py, kernels/ops_mlx.py): the same numbers as separate
matmuls, bit for bit.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RowParts:
    """An [n, k] weight as row blocks: rows[i] rows of it in parts[i], a backend's own
    weight (packed or dense, in that backend's layout); n = sum(rows)."""

    parts: tuple[Any, ...]
    rows: tuple[int, ...]
    in_features: int

    def __post_init__(self) -> None:
        if len(self.parts) < 2 or len(self.parts) != len(self.rows):
            raise ValueError("RowParts needs two or more parts, each with its row count")
        if min(self.rows) <= 0 or self.in_features <= 0:
            raise ValueError(f"row counts {self.rows} and k={self.in_features} must be positive")

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(self.rows), self.in_features)

    @property
    def nbytes(self) -> int:
        return sum(int(part.nbytes) for part in self.parts)

    @cached_property
    def bounds(self) -> tuple[tuple[int, int], ...]:
        """Each part's rows of the whole: [start, stop) (its columns of x @ W^T); kept, as
        a decode step asks for them once a layer."""
        stops = tuple(itertools.accumulate(self.rows))
        return tuple(zip((0, *stops[:-1]), stops, strict=True))

    def locate(self, ids: np.ndarray) -> list[tuple[Any, np.ndarray, np.ndarray]]:
        """Rows `ids` by part (an embedding lookup): (part, positions in ids, its own row
        ids) for each part that holds any of them."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = self.shape[0]
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise IndexError(f"row ids must lie in [0, {n})")
        found = []
        for part, (start, stop) in zip(self.parts, self.bounds, strict=True):
            positions = np.flatnonzero((ids >= start) & (ids < stop))
            if positions.size:
                found.append((part, positions, ids[positions] - start))
        return found


def join_runs(
    ws: list[Any], kind: Callable[[Any], Hashable | None], join: Callable[[list[Any]], Any]
) -> list[Any]:
    """Adjacent weights of one kind joined into one (q|k of one type: one matmul, not
    two); `kind` None never joins."""
    runs: list[list[Any]] = []
    for w in ws:
        key = kind(w)
        if runs and key is not None and kind(runs[-1][-1]) == key:
            runs[-1].append(w)
        else:
            runs.append([w])
    return [run[0] if len(run) == 1 else join(run) for run in runs]
