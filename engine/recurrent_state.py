"""A Gated DeltaNet layer's state: a conv window and a delta-rule matrix per head, folded
through a non-invertible update. It cannot rewind; it goes back by restoring a reference
taken beforehand (kernels never mutate states, so the reference IS the copy) and
replaying: the verify tape (`retain_verified`) or tokens (a truncate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import StateError
from engine.kv_state import UNBOUNDED_DEPTH
from kernels.ops import Array, Ops

# a recorded forward's rows: (conv_in [rows, C], q, k, v, g, beta)
TapeRows = tuple[Array, Array, Array, Array, Array, Array]


@dataclass
class TapePiece:
    """One recorded forward's rows, as arrays or as a function that makes them when a
    replay first reads them. The one-launch step's rows lie in its output, and slicing
    them out is ~11 MLX operations a layer, built lazily: 0.19 ms of host work for the
    Qwen3.5-0.8B shape's 18 layers of an 8-row verify (timed on the development CPU),
    which a verify whose drafts all stand, or all fall, never needs."""

    rows: int
    made: TapeRows | None = None
    make: Callable[[], TapeRows] | None = None

    def arrays(self) -> TapeRows:
        if self.made is None:
            assert self.make is not None
            self.made, self.make = self.make(), None
        return self.made


@dataclass
class Tape:
    """Per-row inputs a recurrent layer recorded during a verify pass, a piece a forward."""

    pieces: list[TapePiece] = field(default_factory=list)

    @property
    def conv_in(self) -> list[Array]:  # [rows, C] pieces
        return [piece.arrays()[0] for piece in self.pieces]

    @property
    def qkvgb(self) -> list[tuple[Array, ...]]:  # (q, k, v, g, beta) pieces
        return [piece.arrays()[1:] for piece in self.pieces]

    def num_rows(self) -> int:
        return sum(piece.rows for piece in self.pieces)

    def truncate_pieces(self, num_pieces: int) -> None:
        """Forget the pieces a failed forward recorded."""
        del self.pieces[num_pieces:]


class RecurrentState:
    """Gated DeltaNet state: conv window [K-1, C] and delta-rule matrix [H, Dk, Dv]."""

    kind = "RecurrentState"

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
            self.tape.pieces.append(TapePiece(int(conv_in.shape[0]), (conv_in, q, k, v, g, beta)))

    def record_later(self, rows: int, make: Callable[[], TapeRows]) -> None:
        """`record`, for `rows` rows that `make` gives if a replay reads them."""
        if self.tape is not None:
            self.tape.pieces.append(TapePiece(rows, make=make))

    def needs_snapshots(self) -> bool:
        return True  # a truncate replays tokens from the nearest snapshot

    def max_rollback(self) -> int:
        return 0  # folded history: only a snapshot or a tape can take it back

    def can_rewind(self, depth: int) -> bool:
        return depth <= self.max_rollback()

    def rewind(self, position: int) -> None:
        if position != self.length:
            raise StateError("a recurrent state cannot rewind without a snapshot")

    def snapshot(self) -> Any:
        return (self.conv, self.ssm)  # kernels return new arrays: a reference is a copy

    def checkpoint_snapshot(self) -> Any:
        return self.snapshot()  # a rollback to the checkpoint cannot be a rewind

    def restore(self, snap: Any, position: int) -> None:
        self.conv, self.ssm = snap
        self.length = position

    def reset(self) -> None:
        self.conv = self.ops.zeros(tuple(self.conv.shape))
        self.ssm = self.ops.zeros(tuple(self.ssm.shape), dtype=self.ssm.dtype)
        self.length = 0

    def start_tape(self) -> None:
        self.tape = Tape()

    def stop_tape(self) -> None:
        self.tape = None

    def tape_covers(self, num_rows: int) -> bool:
        return self.tape is not None and self.tape.num_rows() == num_rows

    def max_retain_depth(self) -> int:
        return UNBOUNDED_DEPTH  # the tape replays any number of kept rows

    def replay_verified(
        self, snap: Any, start: int, num_kept: int, stops: Sequence[int]
    ) -> tuple[list[Any], Any]:
        """Restore `snap` (taken at `start`) and fold in the taped rows up to each stop,
        then up to `num_kept`. Folding in pieces equals one fold bit for bit: the
        recurrent kernel and the conv window go token by token."""
        if self.tape is None:
            raise StateError("no verify tape to replay")
        conv, ssm = snap
        snaps: list[Any] = []
        cuts = [stop - start for stop in stops] + [num_kept]
        if num_kept or stops:
            ops = self.ops
            conv_in = ops.concat(self.tape.conv_in, axis=0)
            qkvgb = [ops.concat([piece[i] for piece in self.tape.qkvgb], axis=0) for i in range(5)]
            done = 0
            for cut in cuts:
                if cut > done:
                    conv = ops.conv_state_after(conv, conv_in[done:cut])
                    q, k, v, g, beta = (x[done:cut] for x in qkvgb)
                    _, ssm = ops.gated_delta_recurrent(q, k, v, g, beta, ssm)
                snaps.append((conv, ssm))
                done = cut
            # evaluated here, so a failure (out of memory) shows before anything changes
            ops.evaluate(*[a for pair in snaps for a in pair])
        return snaps[: len(stops)], (conv, ssm)

    def adopt_verified(self, replayed: Any, position: int) -> None:
        self.conv, self.ssm = replayed
        self.length = position

    def begin_forward(self) -> Any:
        pieces = len(self.tape.pieces) if self.tape is not None else 0
        return self.conv, self.ssm, self.length, pieces

    def end_forward(self) -> None:
        """Nothing to drop: the restore point is three references."""

    def undo_forward(self, point: Any) -> bool:
        # the forward assigns new arrays and never writes into these: they are intact
        self.conv, self.ssm, self.length, pieces = point
        if self.tape is not None:
            self.tape.truncate_pieces(pieces)
        return True

    def nbytes(self) -> int:
        return self.ops.nbytes(self.conv) + self.ops.nbytes(self.ssm)

    def live_arrays(self) -> list[Array]:
        return [self.conv, self.ssm]

    def can_append_rows(self) -> bool:
        return True  # its cached form is the snapshot at the tail's end, not rows

    def copy_rows(self, start: int, end: int) -> None:
        return None  # no rows to copy: the branch cache keeps this layer's snapshots

    def rows_nbytes(self, start: int, end: int) -> int:
        return 0

    def append_cached(self, rows: Any, snap: Any, num_rows: int) -> None:
        """Jump `num_rows` ahead to the snapshot the branch cache kept for that position."""
        if snap is None:
            raise StateError("a recurrent layer needs the tail's snapshot at that length")
        self.restore(snap, self.length + num_rows)

    def arrays(self) -> dict[str, Array]:
        return {"conv": self.conv, "ssm": self.ssm}

    def load_arrays(self, arrays: dict[str, Array], length: int) -> None:
        self.conv = self.ops.asarray(arrays["conv"])
        self.ssm = _as_f32(self.ops, arrays["ssm"])
        self.length = length


def _as_f32(ops: Ops, array: Any) -> Any:
    """A saved recurrent state as float32, as the recurrence keeps it: `ops.asarray` would
    round it through the compute dtype (bfloat16 on a GPU) first, and a reloaded state
    would no longer continue as the saved one did."""
    if ops.name == "numpy":
        return ops.asarray(array)
    import mlx.core as mx

    return (mx.array(array) if isinstance(array, np.ndarray) else array).astype(mx.float32)


def _f32(ops: Ops) -> Any:
    if ops.name == "numpy":
        return np.float32
    import mlx.core as mx

    return mx.float32
