"""Attention layers' key/value rows: `FullKV` (one row per position) here, and `SlidingKV`
(a ring over the last `window + slack` positions) in engine/sliding_kv.py. Both undo a
verify by moving a cursor; how they answer the rest of the `LayerState` protocol
(engine/state.py) is where they differ.

Rows are stored in the op set's `kv_dtype` (float16 on the NumPy backend by default, the
compute dtype on MLX), rounded once when written, and attention reads every row from
there, the forward's own included: a row is the same numbers whichever forward wrote it
and however many rows it had, so rollback stays reference-equal in float16 too. Every
copy (snapshots, branch-cache tails, saved states) keeps that dtype; loading rows of
another dtype is refused (`check_kv_dtype`), since rounding or widening them would not
give the rows a fresh prefill computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kernels.ops import Array, CausalMask, Ops

_GROW = 256  # KV rows are allocated in whole chunks of this many positions
_GROWTH = 1.5  # a full buffer grows by this factor: amortised O(1) copies per row
UNBOUNDED_DEPTH = 1 << 30  # "any number of rows", where a layer sets no bound


def causal_mask(q_start: int, num_q: int, k_positions: np.ndarray, window: int = 0) -> Any:
    """bool [num_q, S]: query at q_start+i sees key positions <= its own (and > pos-window)."""
    q_pos = np.arange(q_start, q_start + num_q)[:, None]
    mask = (k_positions[None, :] <= q_pos) & (k_positions[None, :] >= 0)
    if window:
        mask &= k_positions[None, :] > q_pos - window
    return mask


def dtype_name(dtype: Any) -> str:
    """NumPy's and MLX's dtypes by one name: 'float16', 'float32', 'bfloat16'."""
    try:
        return np.dtype(dtype).name
    except TypeError:  # an MLX Dtype
        return str(dtype).rsplit(".", 1)[-1]


def check_kv_dtype(ops: Ops, arrays: dict[str, Array]) -> None:
    """Refuse rows of another dtype than the layer stores (a saved state's)."""
    want = dtype_name(ops.kv_dtype)
    for key in ("k", "v"):
        if key in arrays and dtype_name(arrays[key].dtype) != want:
            got = dtype_name(arrays[key].dtype)
            raise ValueError(f"its {key} rows are {got}; this engine keeps K/V in {want}")


def kv_rows(ops: Ops, x: Array) -> Array:
    """x [H, L, D] rounded once to the KV dtype (x itself where it is already in it)."""
    if x.dtype == ops.kv_dtype:
        return x
    return ops.write_rows(ops.zeros(tuple(x.shape), ops.kv_dtype), 0, x)


class CursorRows:
    """What both attention caches share: rows past a verify's checkpoint are dropped by
    rewinding the cursor (`adopt_verified`, validated beforehand by `can_rewind`), so a
    checkpoint holds no snapshot."""

    keys: Any
    values: Any
    length: int

    def checkpoint_snapshot(self) -> Any:
        return None

    def live_arrays(self) -> list[Array]:
        return [a for a in (self.keys, self.values) if a is not None]


class FullKV(CursorRows):
    """Full-attention KV rows [Hkv, capacity, D] (C-contiguous, `ops.kv_dtype`); rows past
    `length` are garbage. A caller writing rows itself (a C decode step) writes position p
    at [:, p] of `keys` / `values` after `reserve`, then moves `length`."""

    kind = "FullKV"

    def __init__(
        self, ops: Ops, num_kv_heads: int, head_dim: int, context_length: int | None = None
    ) -> None:
        self.ops = ops
        self.shape = (num_kv_heads, head_dim)
        # geometric growth stops at the model's context (8k rows, not 10.5k, at its end);
        # a caller going past it still gets room
        self.context_length = context_length
        self.keys: Any = None
        self.values: Any = None
        self.length = 0

    def capacity(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[1])

    def append(self, k: Array, v: Array) -> tuple[Array, Array, Any]:
        L = int(k.shape[1])
        start, end = self.length, self.length + L
        self._make_room(end)
        self.keys = self.ops.write_rows(self.keys, start, k)
        self.values = self.ops.write_rows(self.values, start, v)
        self.length = end
        mask = None if L == 1 else CausalMask(start, L)
        return self.keys[:, :end], self.values[:, :end], mask

    def _make_room(self, end: int) -> None:
        """Grow geometrically: fixed-size steps would copy O(n^2) rows over a long context."""
        if end > self.capacity():
            grown = int(self.capacity() * _GROWTH)
            if self.context_length is not None and end <= self.context_length:
                grown = min(grown, self.context_length)
            self.reserve(max(end, grown))

    def reserve(self, needed: int) -> None:
        """Reallocate to `needed` rows rounded up to a whole chunk, keeping the rows held:
        exactly that capacity, so callers can give every layer the same one (the fused
        step). Always reallocates (even to the same capacity): check `capacity()` first.
        """
        H, D = self.shape
        new_cap = -(-needed // _GROW) * _GROW
        fresh_k = self.ops.zeros((H, new_cap, D), self.ops.kv_dtype)
        fresh_v = self.ops.zeros((H, new_cap, D), self.ops.kv_dtype)
        if self.keys is not None and self.length:
            fresh_k = self.ops.write_rows(fresh_k, 0, self.keys[:, : self.length])
            fresh_v = self.ops.write_rows(fresh_v, 0, self.values[:, : self.length])
        self.keys, self.values = fresh_k, fresh_v

    def replace_buffers(self, keys: Array, values: Array, length: int) -> None:
        """Adopt full-capacity buffers written elsewhere (a fused decode step) and their cursor."""
        self.keys, self.values = keys, values
        self.length = length

    def needs_snapshots(self) -> bool:
        return False  # rows up to any earlier position stay valid: the cursor reaches them

    def max_rollback(self) -> int:
        return self.length

    def can_rewind(self, depth: int) -> bool:
        return True  # rows up to any earlier position stay valid

    def snapshot(self) -> Any:
        return None  # rows up to any earlier position stay valid: the cursor is enough

    def restore(self, snap: Any, position: int) -> None:
        self.length = position

    def rewind(self, position: int) -> None:
        self.length = position

    def adopt_verified(self, replayed: Any, position: int) -> None:
        self.rewind(position)

    def start_tape(self) -> None:
        """Nothing to record: a rewind alone takes the rows back."""

    def stop_tape(self) -> None:
        """Nothing was recorded."""

    def tape_covers(self, num_rows: int) -> bool:
        return True

    def max_retain_depth(self) -> int:
        return UNBOUNDED_DEPTH  # every row stays until overwritten past the cursor

    def replay_verified(
        self, snap: Any, start: int, num_kept: int, stops: Sequence[int]
    ) -> tuple[list[Any], Any]:
        return [None] * len(stops), None  # the cursor reaches every position

    def begin_forward(self) -> Any:
        return self.length, self.keys is not None

    def end_forward(self) -> None:
        """Nothing to drop: the restore point is the cursor."""

    def undo_forward(self, point: Any) -> bool:
        length, had_buffers = point
        if had_buffers and self.keys is None:
            return False  # a fused step donated its buffers and failed: the rows are gone
        self.length = length  # rows before it are untouched: writes land past the cursor
        return True

    def reset(self) -> None:
        self.length = 0

    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return self.ops.nbytes(self.keys) + self.ops.nbytes(self.values)

    def can_append_rows(self) -> bool:
        return True

    def copy_rows(self, start: int, end: int) -> tuple[Array, Array]:
        """Rows [start, end) as new arrays (for the branch cache)."""
        ops = self.ops
        return ops.snapshot(self.keys[:, start:end]), ops.snapshot(self.values[:, start:end])

    def rows_nbytes(self, start: int, end: int) -> int:
        return self.ops.nbytes(self.keys[:, start:end]) + self.ops.nbytes(self.values[:, start:end])

    def append_cached(self, rows: Any, snap: Any, num_rows: int) -> None:
        """Append the first `num_rows` of rows computed earlier for the same positions and
        prefix (`copy_rows`'s output); the snapshot is not needed."""
        keys, values = rows[0][:, :num_rows], rows[1][:, :num_rows]
        end = self.length + int(keys.shape[1])
        self._make_room(end)
        self.keys = self.ops.write_rows(self.keys, self.length, keys)
        self.values = self.ops.write_rows(self.values, self.length, values)
        self.length = end

    def arrays(self) -> dict[str, Array]:
        if self.keys is None or self.length == 0:
            return {}
        return {"k": self.keys[:, : self.length], "v": self.values[:, : self.length]}

    def load_arrays(self, arrays: dict[str, Array], length: int) -> None:
        check_kv_dtype(self.ops, arrays)
        self.keys = self.values = None
        self.length = 0
        if length:
            self.reserve(length)
            self.keys = self.ops.write_rows(self.keys, 0, arrays["k"])
            self.values = self.ops.write_rows(self.values, 0, arrays["v"])
        self.length = length


def reserve_alike(caches: list[FullKV], need: int, step: int) -> None:
    """Give every cache one capacity of at least `need` rows, grown in multiples of `step`:
    the fused step kernel strides every layer's cache by the first one's (its builds and
    scratch follow the capacity, hence the large steps)."""
    capacities = {kv.capacity() for kv in caches}
    if any(kv.capacity() < need for kv in caches) or len(capacities) > 1:
        capacity = max(-(-need // step) * step, *capacities)
        for kv in caches:
            if kv.capacity() != capacity:
                kv.reserve(capacity)
