"""Sequence state: every layer's cache behind one protocol, with exact rollback.

Three kinds of per-layer state with opposite rollback needs (DESIGN.md):

- `FullKV`: one row per position; rewinding moves a cursor, nothing is copied.
- `SlidingKV`: a ring of `window + slack` rows; rewinds at most `slack` positions
  cheaply (`max_rollback()`); deeper ones need a snapshot of the ring.
- `RecurrentState` (Gated DeltaNet): a fixed-size matrix per head plus a short conv
  window folded through a non-invertible update. The only ways back are a reference
  taken beforehand (kernels never mutate states, so the reference IS the copy) plus
  replay: of the verify tape (`rollback_retaining`) or of tokens (`truncate`).

`SequenceState` orchestrates them; nothing outside this module asks which kind a
layer is. Every operation validates before mutating, so a refused call leaves the
state exactly as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import StateError
from kernels.ops import Array, Ops

_GROW = 256  # KV rows are preallocated in chunks of this many positions


def causal_mask(q_start: int, num_q: int, k_positions: np.ndarray, window: int = 0) -> Any:
    """bool [num_q, S]: query at q_start+i sees key positions <= its own (and > pos-window)."""
    q_pos = np.arange(q_start, q_start + num_q)[:, None]
    mask = (k_positions[None, :] <= q_pos) & (k_positions[None, :] >= 0)
    if window:
        mask &= k_positions[None, :] > q_pos - window
    return mask


class FullKV:
    """Full-attention KV rows [Hkv, capacity, D]; rows past `length` are garbage."""

    def __init__(self, ops: Ops, num_kv_heads: int, head_dim: int) -> None:
        self.ops = ops
        self.shape = (num_kv_heads, head_dim)
        self.keys: Any = None
        self.values: Any = None
        self.length = 0

    def capacity(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[1])

    def append(self, k: Array, v: Array) -> tuple[Array, Array, Any]:
        L = int(k.shape[1])
        start, end = self.length, self.length + L
        if end > self.capacity():
            self.reserve(end)
        self.keys = self.ops.write_rows(self.keys, start, k)
        self.values = self.ops.write_rows(self.values, start, v)
        self.length = end
        mask = None if L == 1 else causal_mask(start, L, np.arange(end))
        return self.keys[:, :end], self.values[:, :end], mask

    def reserve(self, needed: int) -> None:
        """Reallocate to `needed` rows rounded up to a whole chunk, keeping the rows held.

        Always reallocates (even to the same capacity): callers check `capacity()` first.
        """
        H, D = self.shape
        new_cap = -(-needed // _GROW) * _GROW
        fresh_k = self.ops.zeros((H, new_cap, D))
        fresh_v = self.ops.zeros((H, new_cap, D))
        if self.keys is not None and self.length:
            fresh_k = self.ops.write_rows(fresh_k, 0, self.keys[:, : self.length])
            fresh_v = self.ops.write_rows(fresh_v, 0, self.values[:, : self.length])
        self.keys, self.values = fresh_k, fresh_v

    def replace_buffers(self, keys: Array, values: Array, length: int) -> None:
        """Adopt full-capacity buffers written elsewhere (a fused decode step) and their cursor."""
        self.keys, self.values = keys, values
        self.length = length

    def live_arrays(self) -> list[Array]:
        return [self.keys, self.values]

    def max_rollback(self) -> int:
        return self.length

    def snapshot(self) -> Any:
        return None  # rows up to any earlier position stay valid: the cursor is enough

    def restore(self, snap: Any, position: int) -> None:
        self.length = position

    def rewind(self, position: int) -> None:
        self.length = position

    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return self.ops.nbytes(self.keys) + self.ops.nbytes(self.values)

    def arrays(self) -> dict[str, Array]:
        if self.keys is None or self.length == 0:
            return {}
        return {"k": self.keys[:, : self.length], "v": self.values[:, : self.length]}

    def load_arrays(self, arrays: dict[str, Array], length: int) -> None:
        self.keys = self.values = None
        self.length = 0
        if length:
            self.reserve(length)
            self.keys = self.ops.write_rows(self.keys, 0, arrays["k"])
            self.values = self.ops.write_rows(self.values, 0, arrays["v"])
        self.length = length


class SlidingKV:
    """A ring of `window + slack` KV rows; row of position p lives in slot p % size."""

    def __init__(self, ops: Ops, num_kv_heads: int, head_dim: int, window: int, slack: int):
        if window < 1 or slack < 0:
            raise ValueError("window must be >= 1 and slack >= 0")
        self.ops = ops
        self.window, self.slack, self.size = window, slack, window + slack
        self.keys = ops.zeros((num_kv_heads, self.size, head_dim))
        self.values = ops.zeros((num_kv_heads, self.size, head_dim))
        self.positions = np.full(self.size, -1, dtype=np.int64)  # host-side metadata
        self.length = 0

    def append(self, k: Array, v: Array) -> tuple[Array, Array, Any]:
        L = int(k.shape[1])
        start = self.length
        # Attend over the ring as it was plus the new rows, then write: a chunk longer
        # than the slack would otherwise overwrite rows its own first queries need.
        keys = self.ops.concat([self.keys, k], axis=1)
        values = self.ops.concat([self.values, v], axis=1)
        k_pos = np.concatenate([self.positions, np.arange(start, start + L)])
        mask = causal_mask(start, L, k_pos, self.window)
        for j in range(max(0, L - self.size), L):  # only the last `size` rows survive
            slot = (start + j) % self.size
            self.keys = self.ops.write_rows(self.keys, slot, k[:, j : j + 1])
            self.values = self.ops.write_rows(self.values, slot, v[:, j : j + 1])
            self.positions[slot] = start + j
        self.length = start + L
        return keys, values, mask

    def max_rollback(self) -> int:
        """How many positions back a rewind can go with the rows the ring still holds."""
        oldest = int(self.positions[self.positions >= 0].min()) if self.length else 0
        if oldest == 0:  # nothing evicted yet: every earlier position is still held
            return self.length
        # a query at position n needs keys n-window+1 .. n-1
        return max(0, self.length - (oldest + self.window - 1))

    def rewind(self, position: int) -> None:
        if self.length - position > self.max_rollback():
            raise StateError(
                f"sliding-window layer cannot rewind {self.length - position} positions "
                f"(ring slack allows {self.max_rollback()}); a snapshot is needed"
            )
        self.positions[self.positions >= position] = -1
        self.length = position

    def snapshot(self) -> Any:
        return (
            self.ops.snapshot(self.keys),
            self.ops.snapshot(self.values),
            self.positions.copy(),
        )

    def restore(self, snap: Any, position: int) -> None:
        keys, values, positions = snap
        self.keys, self.values = self.ops.snapshot(keys), self.ops.snapshot(values)
        self.positions = positions.copy()
        self.length = position

    def nbytes(self) -> int:
        return self.ops.nbytes(self.keys) + self.ops.nbytes(self.values)

    def live_arrays(self) -> list[Array]:
        return [self.keys, self.values]

    def arrays(self) -> dict[str, Array]:
        return {"k": self.keys, "v": self.values, "pos": self.positions}

    def load_arrays(self, arrays: dict[str, Array], length: int) -> None:
        self.keys = self.ops.asarray(arrays["k"])
        self.values = self.ops.asarray(arrays["v"])
        self.positions = np.asarray(arrays["pos"], dtype=np.int64).copy()
        self.length = length


@dataclass
class Tape:
    """Per-row inputs a recurrent layer recorded during a verify pass."""

    conv_in: list[Array] = field(default_factory=list)  # [rows, C] pieces
    qkvgb: list[tuple[Array, ...]] = field(default_factory=list)  # (q, k, v, g, beta) pieces

    def num_rows(self) -> int:
        return sum(int(x.shape[0]) for x in self.conv_in)


class RecurrentState:
    """Gated DeltaNet state: conv window [K-1, C] and delta-rule matrix [H, Dk, Dv]."""

    def __init__(
        self, ops: Ops, conv_channels: int, conv_kernel: int, heads: int, dk: int, dv: int
    ):
        self.ops = ops
        self.conv = ops.zeros((conv_kernel - 1, conv_channels))
        self.ssm = ops.zeros((heads, dk, dv), dtype=_f32(ops))
        self.length = 0
        self.tape: Tape | None = None  # set while a verify is being recorded

    def record(self, conv_in: Array, q: Array, k: Array, v: Array, g: Array, beta: Array) -> None:
        if self.tape is not None:
            self.tape.conv_in.append(conv_in)
            self.tape.qkvgb.append((q, k, v, g, beta))

    def max_rollback(self) -> int:
        return 0  # folded history: only a snapshot or a tape can take it back

    def rewind(self, position: int) -> None:
        if position != self.length:
            raise StateError("a recurrent state cannot rewind without a snapshot")

    def snapshot(self) -> Any:
        return (self.conv, self.ssm)  # kernels return new arrays: a reference is a copy

    def restore(self, snap: Any, position: int) -> None:
        self.conv, self.ssm = snap
        self.length = position

    def replay(self, snap: Any, start: int, keep: int) -> None:
        """Restore `snap` (taken at `start`) and fold in the first `keep` taped rows."""
        assert self.tape is not None
        conv, ssm = snap
        if keep:
            ops = self.ops
            conv_in = ops.concat(self.tape.conv_in, axis=0)[:keep]
            q, k, v, g, beta = (
                ops.concat([piece[i] for piece in self.tape.qkvgb], axis=0)[:keep] for i in range(5)
            )
            conv = ops.conv_state_after(conv, conv_in)
            _, ssm = ops.gated_delta_recurrent(q, k, v, g, beta, ssm)
        self.conv, self.ssm = conv, ssm
        self.length = start + keep

    def nbytes(self) -> int:
        return self.ops.nbytes(self.conv) + self.ops.nbytes(self.ssm)

    def live_arrays(self) -> list[Array]:
        return [self.conv, self.ssm]

    def arrays(self) -> dict[str, Array]:
        return {"conv": self.conv, "ssm": self.ssm}

    def load_arrays(self, arrays: dict[str, Array], length: int) -> None:
        self.conv = self.ops.asarray(arrays["conv"])
        self.ssm = self.ops.asarray(arrays["ssm"]).astype(_f32(self.ops))
        self.length = length


def _f32(ops: Ops) -> Any:
    if ops.name == "numpy":
        return np.float32
    import mlx.core as mx

    return mx.float32


LayerState = FullKV | SlidingKV | RecurrentState


def full_kv_layers(layers: Sequence[LayerState]) -> list[FullKV] | None:
    """Every layer as a FullKV when all of them are full attention (the fused path), else None."""
    full = [layer for layer in layers if isinstance(layer, FullKV)]
    return full if len(full) == len(layers) else None


@dataclass(frozen=True)
class Checkpoint:
    """An opaque restore point from `SequenceState.checkpoint`."""

    position: int
    epoch: int
    layer_snaps: tuple[Any, ...]
    recording: bool


@dataclass(frozen=True)
class SnapshotPolicy:
    """Where deep-rollback snapshots are kept (only for layers that need them)."""

    stride: int = 256  # one every `stride` tokens, so a truncate replays at most this many
    stride_capacity: int = 32  # the stride ring's size; the oldest is evicted
    marked_capacity: int = 64  # caller-marked (turn boundary) snapshots, LRU
    sliding_slack: int = 64  # extra ring rows beyond a sliding window: cheap rewind depth

    def __post_init__(self) -> None:
        if min(self.stride - 1, self.stride_capacity, self.marked_capacity, self.sliding_slack) < 0:
            raise ValueError("stride must be >= 1 and capacities >= 0")


def copy_rows(layer: FullKV, start: int, end: int) -> tuple[Array, Array]:
    """Rows [start, end) of a full-attention layer, as new arrays (for the branch cache)."""
    ops = layer.ops
    return ops.snapshot(layer.keys[:, start:end]), ops.snapshot(layer.values[:, start:end])


def append_rows(layer: FullKV, keys: Array, values: Array) -> None:
    """Append cached rows computed earlier for the same positions and prefix."""
    end = layer.length + int(keys.shape[1])
    if end > layer.capacity():
        layer.reserve(end)
    layer.keys = layer.ops.write_rows(layer.keys, layer.length, keys)
    layer.values = layer.ops.write_rows(layer.values, layer.length, values)
    layer.length = end
