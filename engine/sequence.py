"""A sequence's whole computed state: committed tokens, every layer's cache, snapshots.

The contracts (docs/DESIGN.md): after any sequence of appends, rollbacks, truncations and
retaining rollbacks the next-token logits equal a fresh prefill of the same tokens;
an operation that cannot be served exactly is refused (StateError) before anything
changes, or takes an explicit exact fallback (replay from an earlier snapshot).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from engine.errors import StateError
from engine.snapshot_store import STORES, SnapshotStores, distinct_nbytes
from engine.state import UNBOUNDED_DEPTH, Checkpoint, LayerState, SnapshotPolicy
from kernels.ops import Array, Ops


class SequenceState:
    def __init__(self, ops: Ops, layers: list[LayerState], policy: SnapshotPolicy | None = None):
        self.ops = ops
        self.layers = layers
        self.policy = policy or SnapshotPolicy()
        self.tokens: list[int] = []
        self.epoch = 0  # bumped by every rewind; checkpoints from an older epoch are stale
        self.is_poisoned = False  # a failed forward could not be undone; only reset() recovers
        self._recording: Checkpoint | None = None
        self._forward_points: list[Any] | None = None  # each layer's, while a forward runs
        self.needs_snapshots = any(layer.needs_snapshots() for layer in layers)
        depth = min((layer.max_retain_depth() for layer in layers), default=UNBOUNDED_DEPTH)
        self._max_verify_rows = min(depth + 1, UNBOUNDED_DEPTH)  # fixed, as layers' slack is
        self._snapshots = SnapshotStores(self.policy)

    @property
    def offset(self) -> int:
        return len(self.tokens)

    @property
    def is_recording(self) -> bool:
        """A recorded checkpoint (a verify) is open: its rows are not committed yet."""
        return self._recording is not None

    @property
    def recording(self) -> Checkpoint | None:
        """The open recorded checkpoint (after a failed request: roll it back)."""
        return self._recording

    # -- appending (called by the model's forward) ----------------------------------
    def begin_forward(self, num_tokens: int) -> int:
        self._check_usable()
        self._forward_points = [layer.begin_forward() for layer in self.layers]
        self.is_poisoned = True  # cleared by end_forward or a successful abort_forward
        return self.offset

    def end_forward(self, token_ids: list[int]) -> None:
        """The forward's rows are in every layer: commit them, with the snapshot due at
        their end (taken first: if it fails, the caller undoes the whole forward)."""
        end = self.offset + len(token_ids)
        due = self._due_snapshot(end) if self._recording is None else None
        for layer in self.layers:
            layer.end_forward()
        self._forward_points = None
        self.tokens.extend(token_ids)
        self.is_poisoned = False
        if due is not None:
            self._snapshots.take(end, due)

    def abort_forward(self) -> bool:
        """A forward raised after `begin_forward`: put every layer back where it was, so
        the state, its snapshots, its checkpoints and an open recording stay as they were.
        Returns False (the state stays poisoned until reset) where a layer cannot."""
        points, self._forward_points = self._forward_points, None
        if points is None:
            return not self.is_poisoned
        try:
            undone = [layer.undo_forward(p) for layer, p in zip(self.layers, points, strict=True)]
            restored = all(undone) and all(lay.length == self.offset for lay in self.layers)
        except Exception:  # the undo itself failed (out of memory again): nothing to trust
            restored = False
        self.is_poisoned = not restored
        return restored

    def _check_usable(self) -> None:
        if self.is_poisoned:
            raise StateError("the state was left inconsistent by a failed forward; reset it")

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
        self.tokens = []
        self.epoch += 1
        self.is_poisoned = False
        self._forward_points = None
        self._end_recording()
        self._snapshots.clear()

    # -- snapshots for deep rollback --------------------------------------------------
    def mark(self, position: int) -> bool:
        """Ask for a snapshot at `position` (a turn boundary), now or when reached.

        Returns whether a truncate to `position` will be served without a replay: False
        for a position behind the cursor that no snapshot holds (the state cannot go
        back to take one; a truncate there replays from an earlier snapshot).
        """
        self._check_usable()
        if position < 0:
            raise StateError(f"cannot mark position {position}")
        if not self.needs_snapshots:
            return True
        held = self._snapshots.merged().get(position)
        if held is not None:  # shared, not copied: a turn boundary outlives the stride ring
            self._snapshots.put("marked", position, held)
            return True
        rows_unverified = self._recording is not None and self._recording.position < position
        if position > self.offset or (position == self.offset and rows_unverified):
            self._snapshots.pending_marks.add(position)  # taken when reached (or committed)
            return True
        if position == self.offset:
            self._snapshots.put("marked", position, self._layer_snapshots())
            return True
        return False

    def set_snapshot_budget(self, max_bytes: int | None) -> None:
        """Bound the snapshot stores' bytes (None: by count only); evicts now if over,
        lowest position first (`SnapshotPolicy`)."""
        self._snapshots.set_budget(max_bytes)

    @property
    def snapshot_budget(self) -> int | None:
        return self._snapshots.max_bytes

    def next_snapshot_position(self) -> int | None:
        """The next position where a forward chunk should stop so a snapshot lands exactly."""
        return self._snapshots.next_due(self.offset) if self.needs_snapshots else None

    def _layer_snapshots(self) -> tuple[Any, ...]:
        return tuple(layer.snapshot() for layer in self.layers)

    def _due_snapshot(self, position: int) -> tuple[Any, ...] | None:
        """The layers' snapshots when one is due at `position` (where they are now)."""
        if self.needs_snapshots and self._snapshots.is_due(position):
            return self._layer_snapshots()
        return None

    def snapshot_positions(self) -> list[int]:
        return self._snapshots.positions()

    def snapshot_items(self) -> list[tuple[str, int, tuple[Any, ...]]]:
        """(store, position, per-layer snaps) for every stored snapshot, oldest first per
        store; store is "stride" or "marked". For saving a state."""
        return self._snapshots.items()

    def load_snapshot(self, position: int, store: str, snaps: tuple[Any, ...]) -> None:
        """Put back a snapshot from `snapshot_items` (loading a saved state), as the newest."""
        if store not in STORES or len(snaps) != len(self.layers):
            raise StateError(f"not a snapshot of this state: {store!r}, {len(snaps)} layers")
        if not 0 <= position <= self.offset:
            raise StateError(f"snapshot at {position} is outside the {self.offset} tokens")
        self._snapshots.put(store, position, snaps)

    def snapshot_nbytes(self) -> int:
        """Bytes held by stored snapshots (each distinct array counted once)."""
        return self._snapshots.nbytes()

    def nbytes(self) -> int:
        """Bytes of the layers and the snapshots, an array both hold counted once."""
        live = [a for layer in self.layers for a in layer.live_arrays()]
        return distinct_nbytes([*live, *self._snapshots.arrays()])

    def max_verify_rows(self) -> int:
        """Most rows a recorded verify may forward so that `rollback_retaining` keeps any."""
        return self._max_verify_rows

    # -- truncate: roll back to an earlier position (an edit point) -------------------
    def plan_truncate(self, n: int) -> int:
        """The position truncate(n) restores to before replaying; validates, mutates nothing."""
        self._check_usable()
        if not 0 <= n <= self.offset:
            raise StateError(f"cannot truncate to {n}: the state holds {self.offset} tokens")
        if self._can_rewind_directly(n):
            return n
        for pos in sorted(self._stored_snapshots(), reverse=True):
            if pos <= n:
                return pos
        return 0  # the explicit exact fallback: replay from the start

    def _can_rewind_directly(self, n: int) -> bool:
        return all(layer.can_rewind(self.offset - n) for layer in self.layers)

    def stored_snapshots(self) -> dict[int, tuple[Any, ...]]:
        return self._stored_snapshots()

    def adopt_tokens(self, tokens: list[int]) -> None:
        """Record tokens whose rows were appended directly (the branch cache)."""
        self.tokens.extend(tokens)
        self.epoch += 1

    def _stored_snapshots(self) -> dict[int, tuple[Any, ...]]:
        return self._snapshots.merged()

    def restore_to(self, position: int) -> list[int]:
        """Restore to `position` (from plan_truncate); returns the tokens dropped."""
        if position == self.offset:
            self._snapshots.drop_after(position)  # marks past an edit point are stale
            return []
        if position != self.plan_truncate(position):
            raise StateError(f"position {position} is not directly restorable; use plan_truncate")
        dropped = self.tokens[position:]
        try:
            if position == 0:  # the empty state: every kind rebuilds it without a snapshot
                for layer in self.layers:
                    layer.reset()
            elif self._can_rewind_directly(position):
                for layer in self.layers:
                    layer.rewind(position)
            else:
                self._restore_layers(self._stored_snapshots()[position], position)
        except BaseException:  # a ring's copy ran out of memory with some layers restored
            self.is_poisoned = True
            raise
        self.tokens = self.tokens[:position]
        self._forget_after(position)
        return dropped

    def _restore_layers(self, snaps: tuple[Any, ...], position: int) -> None:
        """Each layer back to its snapshot at `position`; a None snapshot is a rewind."""
        for layer, snap in zip(self.layers, snaps, strict=True):
            if snap is None:
                layer.rewind(position)
            else:
                layer.restore(snap, position)

    def _forget_after(self, position: int) -> None:
        self.epoch += 1
        self._end_recording()
        self._snapshots.drop_after(position)

    # -- checkpoint / rollback / rollback_retaining (speculative verify) -------------
    def checkpoint(self, record: bool = False) -> Checkpoint:
        """A restore point here; with `record`, the next forwards tape what a retaining
        rollback and the snapshots inside the verified rows need."""
        self._check_usable()
        if self._recording is not None:
            raise StateError("a recorded checkpoint is still open; roll it back or commit it")
        snaps = tuple(layer.checkpoint_snapshot() for layer in self.layers)
        cp = Checkpoint(self.offset, self.epoch, snaps, record)
        if record:
            self._recording = cp
            for layer in self.layers:
                layer.start_tape()
        return cp

    def _validate(self, cp: Checkpoint, target: int | None = None) -> None:
        """Checks before any mutation; `target` is where the call rewinds to (default cp)."""
        self._check_usable()
        if cp.epoch != self.epoch:
            raise StateError("stale checkpoint: the state was rolled back since it was taken")
        if cp.position > self.offset:
            raise StateError("checkpoint is ahead of the state")
        depth = self.offset - (cp.position if target is None else target)
        for layer, snap in zip(self.layers, cp.layer_snaps, strict=True):
            # a layer the checkpoint holds a snapshot of goes back by restoring it
            if snap is None and not layer.can_rewind(depth):
                raise StateError(
                    f"rollback of {depth} positions exceeds a sliding window's slack "
                    f"({layer.max_rollback()})"
                )

    def rollback(self, cp: Checkpoint) -> None:
        """Undo everything since `cp` exactly; the checkpoint is consumed."""
        self._validate(cp)
        self._restore_layers(cp.layer_snaps, cp.position)
        self.tokens = self.tokens[: cp.position]
        self._forget_after(cp.position)

    def commit(self, cp: Checkpoint) -> None:
        """Keep everything since a recorded checkpoint (a full accept): drop the tape,
        leaving the snapshots due inside the verified rows (replayed from the tape)."""
        self._validate(cp, target=self.offset)
        if self._recording is not cp:
            raise StateError("commit needs the open recorded checkpoint")
        stops = self._due_inside(cp.position, self.offset)
        inner = self._replay(cp, stops[-1] - cp.position, stops)[0] if stops else []
        final = self._due_snapshot(self.offset)  # all that can fail runs before any change
        self._end_recording()
        self._store_inner(stops, inner)
        if final is not None:
            self._snapshots.take(self.offset, final)

    def rollback_retaining(self, cp: Checkpoint, keep_rows: int) -> None:
        """After a recorded verify, keep its first `keep_rows` rows and drop the rest.

        Attention layers trim the rejected tail; recurrent layers restore the state from
        before the verify and replay the kept rows from the tape. No model pass. The
        replay runs before anything changes, so a failure there leaves the verify open.
        """
        self._validate(cp, target=cp.position + keep_rows)
        if self._recording is not cp:
            raise StateError("rollback_retaining needs the open recorded checkpoint")
        rows = self.offset - cp.position
        if not 0 <= keep_rows <= rows:
            raise StateError(f"keep_rows={keep_rows} outside the {rows} verified rows")
        if not all(layer.tape_covers(rows) for layer in self.layers):
            raise StateError("the verify tape does not cover the rows since the checkpoint")
        keep_pos = cp.position + keep_rows
        stops = self._due_inside(cp.position, keep_pos + 1)  # keep_pos's own included
        inner, replayed = self._replay(cp, keep_rows, stops)
        for layer, result in zip(self.layers, replayed, strict=True):
            layer.adopt_verified(result, keep_pos)
        self.tokens = self.tokens[:keep_pos]
        self._end_recording()
        self.epoch += 1
        self._snapshots.drop_after(keep_pos)  # nothing is held past it; marks there are stale
        self._store_inner(stops, inner)

    def _due_inside(self, start: int, end: int) -> list[int]:
        """The positions in (start, end) where a snapshot is due."""
        return self._snapshots.due_between(start, end) if self.needs_snapshots else []

    def _replay(
        self, cp: Checkpoint, num_kept: int, stops: list[int]
    ) -> tuple[list[tuple[Any, ...]], list[Any]]:
        """Every layer's snapshots at `stops` (one tuple per stop) and its kept rows."""
        per_layer = [
            layer.replay_verified(snap, cp.position, num_kept, stops)
            for layer, snap in zip(self.layers, cp.layer_snaps, strict=True)
        ]
        inner = [tuple(snaps[i] for snaps, _ in per_layer) for i in range(len(stops))]
        return inner, [replayed for _, replayed in per_layer]

    def _store_inner(self, stops: list[int], inner: list[tuple[Any, ...]]) -> None:
        for position, snaps in zip(stops, inner, strict=True):
            self._snapshots.take(position, snaps)

    def _end_recording(self) -> None:
        self._recording = None
        for layer in self.layers:
            layer.stop_tape()


class Forward(Protocol):
    def forward(
        self, token_ids: list[int], state: SequenceState, logits: str = "last"
    ) -> Array: ...


INNER_SNAPSHOT_ROWS = 64  # the most rows a recurrent layer folds again for an inner snapshot


def prefill(
    model: Forward,
    state: SequenceState,
    token_ids: list[int],
    *,
    chunk_size: int = 512,
    on_chunk: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Array | None:
    """Append `token_ids` in chunks, stopping at far snapshot positions; last-row logits,
    or None when `should_stop` asked to stop between chunks (the state then holds
    exactly the chunks already appended)."""
    logits = None
    done = 0
    chunk_size = getattr(model, "prefill_chunk", lambda n: n)(chunk_size)  # a runner's pieces
    while done < len(token_ids):
        if should_stop is not None and should_stop():
            return None
        end = min(len(token_ids), done + chunk_size)
        # a snapshot due near the chunk's start comes from a recorded forward's tape (as a
        # verify's do), a farther one ends the chunk: every chunk reads all the weights
        due = state._due_inside(state.offset, state.offset + end - done)
        far = [p for p in due if p - state.offset > INNER_SNAPSHOT_ROWS]
        end = done + far[0] - state.offset if far else end
        cp = None
        if due and due[0] < state.offset + end - done:  # the tape stays short: a capped chunk
            end, cp = min(end, done + 2 * INNER_SNAPSHOT_ROWS), state.checkpoint(record=True)
        try:
            logits = model.forward(
                token_ids[done:end], state, logits="last" if end == len(token_ids) else "none"
            )
        except BaseException:
            if cp is not None:  # the failed forward was undone; close its recording
                state.rollback(cp)
            raise
        if cp is not None:
            state.commit(cp)
        done = end
        if on_chunk is not None:
            on_chunk(done)
    return logits


def truncate(model: Forward, state: SequenceState, n: int, **prefill_kwargs: Any) -> None:
    """Roll the state back to position n exactly: nearest restorable point, then replay."""
    start = state.plan_truncate(n)
    replay = state.tokens[start:n]
    state.restore_to(start)
    if replay:
        prefill(model, state, replay, **prefill_kwargs)
