"""Sequence state: every layer's cache behind one protocol, with exact rollback.

Three kinds of per-layer state with opposite rollback needs (docs/DESIGN.md):

- `FullKV`: one row per position; rewinding moves a cursor, nothing is copied.
- `SlidingKV`: a ring of `window + slack` rows; rewinds at most `slack` positions
  cheaply (`max_rollback()`); deeper ones need a snapshot of the ring.
- `RecurrentState` (Gated DeltaNet): a fixed-size matrix per head plus a short conv
  window folded through a non-invertible update. The only ways back are a reference
  taken beforehand (kernels never mutate states, so the reference IS the copy) plus
  replay: of the verify tape (`rollback_retaining`) or of tokens (`truncate`).

Each kind answers its own rollback questions through `LayerState` (in engine/kv_state.py,
engine/sliding_kv.py and engine/recurrent_state.py);
`SequenceState` (engine/sequence.py) orchestrates them, and nothing outside this module
asks which kind a layer is. Every operation validates before mutating, so a refused call
leaves the state exactly as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.kv_state import UNBOUNDED_DEPTH, FullKV, causal_mask
from engine.recurrent_state import RecurrentState, Tape
from engine.sliding_kv import SlidingKV
from kernels.ops import Array

__all__ = [
    "Checkpoint",
    "FullKV",
    "LayerState",
    "RecurrentState",
    "SlidingKV",
    "SnapshotPolicy",
    "Tape",
    "UNBOUNDED_DEPTH",
    "causal_mask",
    "full_kv_layers",
]


class LayerState(Protocol):
    """One layer's computed state; `length` is the number of positions it holds.

    A snapshot is opaque to everyone but its layer; None means the cursor is enough.
    """

    length: int
    kind: str  # its name in a saved state file: a file's layers must match the model's

    # -- rewinding and snapshots (truncate, reset) ----------------------------------
    def needs_snapshots(self) -> bool:
        """Whether a deep rewind needs stored snapshots (stride and turn-boundary ones)."""

    def max_rollback(self) -> int:
        """How many positions back `rewind` can go with what the layer still holds."""

    def can_rewind(self, depth: int) -> bool:
        """Whether `rewind` can go `depth` positions back without a snapshot."""

    def rewind(self, position: int) -> None:
        """Back to `position` by moving the cursor (refused where `can_rewind` says no)."""

    def snapshot(self) -> Any:
        """A restore point here for the snapshot stores (None where a cursor suffices)."""

    def restore(self, snap: Any, position: int) -> None:
        """Back to `snap`, taken when the layer held `position` positions."""

    def reset(self) -> None:
        """Back to the empty state, as built."""

    # -- a speculative verify (checkpoint, rollback, rollback_retaining) --------------
    def checkpoint_snapshot(self) -> Any:
        """What a checkpoint must keep to undo what follows (None: a rewind undoes it)."""

    def start_tape(self) -> None:
        """Record what the forwards that follow (a verify) need to be replayed or undone."""

    def stop_tape(self) -> None: ...

    def tape_covers(self, num_rows: int) -> bool:
        """Whether what was recorded since `start_tape` can replay `num_rows` rows."""

    def max_retain_depth(self) -> int:
        """How many verified rows `rollback_retaining` can always drop on this layer,
        whatever the verify appended (UNBOUNDED_DEPTH: any number)."""

    def replay_verified(
        self, snap: Any, start: int, num_kept: int, stops: Sequence[int]
    ) -> tuple[list[Any], Any]:
        """From the checkpoint at `start` (whose `checkpoint_snapshot` is `snap`) and the
        tape: this layer's snapshots at `stops` (positions in (start, length]) and what
        `adopt_verified` needs to keep the first `num_kept` rows. Computes everything
        that can fail; mutates nothing."""

    def adopt_verified(self, replayed: Any, position: int) -> None:
        """Keep the rows up to `position` with `replay_verified`'s result (cannot fail)."""

    # -- a failed forward -------------------------------------------------------------
    def begin_forward(self) -> Any:
        """A restore point before a forward appends to this layer (for `undo_forward`)."""

    def end_forward(self) -> None:
        """The forward succeeded: drop what `undo_forward` would have needed."""

    def undo_forward(self, point: Any) -> bool:
        """After a forward raised: back to `point` exactly; False where it cannot be."""

    # -- memory and evaluation ------------------------------------------------------
    def nbytes(self) -> int: ...

    def live_arrays(self) -> list[Array]:
        """The arrays a forward leaves pending (to evaluate after a logits-free chunk)."""

    # -- the branch cache -----------------------------------------------------------
    def can_append_rows(self) -> bool:
        """Whether a cached branch tail can be appended to this layer."""

    def copy_rows(self, start: int, end: int) -> Any:
        """Positions [start, end) as new arrays for a branch tail (None: no rows kept)."""

    def rows_nbytes(self, start: int, end: int) -> int:
        """The bytes `copy_rows(start, end)` would hand out, copying nothing."""

    def append_cached(self, rows: Any, snap: Any, num_rows: int) -> None:
        """Move `num_rows` ahead using a tail's `copy_rows` output and its snapshot there."""

    # -- saving and loading (engine/state_io.py) ------------------------------------
    def arrays(self) -> dict[str, Array]: ...

    def load_arrays(self, arrays: dict[str, Array], length: int) -> None: ...


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
    """Where deep-rollback snapshots are kept (only for layers that need them).

    Over `max_snapshot_bytes` the snapshot at the lowest position goes first (a stride
    one before a marked one at the same position), whichever store holds it: edits and
    regenerations land near the end, so a truncate to any position at or past the oldest
    snapshot kept still replays at most `stride` tokens, and one further back replays
    from an older snapshot or from position 0, the exact fallbacks.
    """

    stride: int = 256  # one every `stride` tokens, so a truncate replays at most this many
    stride_capacity: int = 32  # the stride ring's size; the oldest is evicted
    marked_capacity: int = 64  # caller-marked (turn boundary) snapshots, LRU
    sliding_slack: int = 64  # extra ring rows beyond a sliding window: cheap rewind depth
    max_snapshot_bytes: int | None = None  # both stores together; None: bounded by count only

    def __post_init__(self) -> None:
        if min(self.stride - 1, self.stride_capacity, self.marked_capacity, self.sliding_slack) < 0:
            raise ValueError("stride must be >= 1 and capacities >= 0")
        if self.max_snapshot_bytes is not None and self.max_snapshot_bytes < 0:
            raise ValueError("max_snapshot_bytes must be >= 0 or None")
