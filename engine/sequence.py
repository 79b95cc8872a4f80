"""A sequence's whole computed state: committed tokens, every layer's cache, snapshots.

The contracts (docs/DESIGN.md): after any sequence of appends, rollbacks, truncations and
retaining rollbacks the next-token logits equal a fresh prefill of the same tokens;
an operation that cannot be served exactly is refused (StateError) before anything
changes, or takes an explicit exact fallback (replay from an earlier snapshot).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from engine.errors import StateError
from engine.state import Checkpoint, LayerState, SnapshotPolicy
from kernels.ops import Array, Ops


class SequenceState:
    def __init__(self, ops: Ops, layers: list[LayerState], policy: SnapshotPolicy | None = None):
        self.ops = ops
        self.layers = layers
        self.policy = policy or SnapshotPolicy()
        self.tokens: list[int] = []
        self.epoch = 0  # bumped by every rewind; checkpoints from an older epoch are stale
        self.is_poisoned = False  # a forward failed half-way; only reset() recovers
        self._recording: Checkpoint | None = None
        self.needs_snapshots = any(layer.needs_snapshots() for layer in layers)
        self._stride_snaps: OrderedDict[int, tuple[Any, ...]] = OrderedDict()
        self._marked_snaps: OrderedDict[int, tuple[Any, ...]] = OrderedDict()
        self._pending_marks: set[int] = set()

    @property
    def offset(self) -> int:
        return len(self.tokens)

    @property
    def is_recording(self) -> bool:
        """A recorded checkpoint (a verify) is open: its rows are not committed yet."""
        return self._recording is not None

    # -- appending (called by the model's forward) ----------------------------------
    def begin_forward(self, num_tokens: int) -> int:
        self._check_usable()
        self.is_poisoned = True  # cleared by end_forward; a raise in between leaves it set
        return self.offset

    def end_forward(self, token_ids: list[int]) -> None:
        self.tokens.extend(token_ids)
        self.is_poisoned = False
        if self._recording is None:
            self._take_due_snapshots()

    def _check_usable(self) -> None:
        if self.is_poisoned:
            raise StateError("the state was left inconsistent by a failed forward; reset it")

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
        self.tokens = []
        self.epoch += 1
        self.is_poisoned = False
        self._end_recording()
        self._stride_snaps.clear()
        self._marked_snaps.clear()
        self._pending_marks.clear()

    # -- snapshots for deep rollback --------------------------------------------------
    def mark(self, position: int) -> None:
        """Ask for a snapshot at `position` (a turn boundary), now or when reached."""
        self._check_usable()
        if not self.needs_snapshots:
            return
        if position == self.offset and self._recording is None:
            self._store(self._marked_snaps, position, self.policy.marked_capacity)
        elif position > self.offset:
            self._pending_marks.add(position)

    def next_snapshot_position(self) -> int | None:
        """The next position where a forward chunk should stop so a snapshot lands exactly."""
        if not self.needs_snapshots:
            return None
        stride = self.policy.stride
        candidates = [(self.offset // stride + 1) * stride] if self.policy.stride_capacity else []
        candidates += [p for p in self._pending_marks if p > self.offset]
        return min(candidates) if candidates else None

    def _take_due_snapshots(self) -> None:
        if not self.needs_snapshots:
            return
        pos = self.offset
        if pos in self._pending_marks:
            self._pending_marks.discard(pos)
            self._store(self._marked_snaps, pos, self.policy.marked_capacity)
        if pos and pos % self.policy.stride == 0:
            self._store(self._stride_snaps, pos, self.policy.stride_capacity)

    def _store(self, store: OrderedDict[int, tuple[Any, ...]], pos: int, capacity: int) -> None:
        if capacity:
            self._put(store, pos, tuple(layer.snapshot() for layer in self.layers), capacity)

    @staticmethod
    def _put(store: OrderedDict[int, tuple[Any, ...]], pos: int, snaps: Any, capacity: int) -> None:
        store[pos] = snaps
        store.move_to_end(pos)
        while len(store) > capacity:
            store.popitem(last=False)

    def snapshot_positions(self) -> list[int]:
        return sorted(set(self._stride_snaps) | set(self._marked_snaps))

    def snapshot_items(self) -> list[tuple[str, int, tuple[Any, ...]]]:
        """(store, position, per-layer snaps) for every stored snapshot, oldest first per
        store; store is "stride" or "marked". For saving a state."""
        stores = (("stride", self._stride_snaps), ("marked", self._marked_snaps))
        return [(name, pos, snaps) for name, store in stores for pos, snaps in store.items()]

    def load_snapshot(self, position: int, store: str, snaps: tuple[Any, ...]) -> None:
        """Put back a snapshot from `snapshot_items` (loading a saved state), as the newest."""
        if store not in ("stride", "marked") or len(snaps) != len(self.layers):
            raise StateError(f"not a snapshot of this state: {store!r}, {len(snaps)} layers")
        if not 0 <= position <= self.offset:
            raise StateError(f"snapshot at {position} is outside the {self.offset} tokens")
        if store == "stride":
            self._put(self._stride_snaps, position, snaps, self.policy.stride_capacity)
        else:
            self._put(self._marked_snaps, position, snaps, self.policy.marked_capacity)

    def snapshot_nbytes(self) -> int:
        """Bytes held by stored snapshots (each distinct array counted once)."""
        seen: dict[int, int] = {}
        for store in (self._stride_snaps, self._marked_snaps):
            for snaps in store.values():
                for snap in snaps:
                    for arr in _arrays_in(snap):
                        seen[id(arr)] = int(arr.nbytes)
        return sum(seen.values())

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers) + self.snapshot_nbytes()

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
        merged = dict(self._stride_snaps)
        merged.update(self._marked_snaps)
        return merged

    def restore_to(self, position: int) -> list[int]:
        """Restore to `position` (from plan_truncate); returns the tokens dropped."""
        if position == self.offset:
            return []
        if position != self.plan_truncate(position):
            raise StateError(f"position {position} is not directly restorable; use plan_truncate")
        dropped = self.tokens[position:]
        if position == 0:  # the empty state: every kind rebuilds it without a snapshot
            for layer in self.layers:
                layer.reset()
        elif self._can_rewind_directly(position):
            for layer in self.layers:
                layer.rewind(position)
        else:
            self._restore_layers(self._stored_snapshots()[position], position)
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
        for store in (self._stride_snaps, self._marked_snaps):
            for pos in [p for p in store if p > position]:
                del store[pos]
        self._pending_marks = {p for p in self._pending_marks if p > position}

    # -- checkpoint / rollback / rollback_retaining (speculative verify) -------------
    def checkpoint(self, record: bool = False) -> Checkpoint:
        """A restore point here; with `record`, the next forwards tape recurrent inputs."""
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
        """Keep everything since a recorded checkpoint (a full accept): drop the tape."""
        self._validate(cp, target=self.offset)
        if self._recording is not cp:
            raise StateError("commit needs the open recorded checkpoint")
        self._end_recording()
        self._take_due_snapshots()

    def rollback_retaining(self, cp: Checkpoint, keep_rows: int) -> None:
        """After a recorded verify, keep its first `keep_rows` rows and drop the rest.

        Attention layers trim the rejected tail; recurrent layers restore the state from
        before the verify and replay the kept rows from the tape. No model pass.
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
        for layer, snap in zip(self.layers, cp.layer_snaps, strict=True):
            layer.retain_verified(snap, cp.position, keep_rows)
        self.tokens = self.tokens[:keep_pos]
        self._end_recording()
        self.epoch += 1
        self._take_due_snapshots()

    def _end_recording(self) -> None:
        self._recording = None
        for layer in self.layers:
            layer.stop_tape()


def _arrays_in(snap: Any) -> list[Any]:
    if snap is None:
        return []
    if isinstance(snap, tuple):
        return [a for a in snap if hasattr(a, "nbytes")]
    return [snap]


class Forward(Protocol):
    def forward(
        self, token_ids: list[int], state: SequenceState, logits: str = "last"
    ) -> Array: ...


def prefill(
    model: Forward,
    state: SequenceState,
    token_ids: list[int],
    *,
    chunk_size: int = 512,
    on_chunk: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Array | None:
    """Append `token_ids` in chunks, stopping at snapshot positions; last-row logits.

    Returns None when `should_stop` asked to stop between chunks (the state then holds
    exactly the chunks already appended).
    """
    logits = None
    done = 0
    while done < len(token_ids):
        if should_stop is not None and should_stop():
            return None
        end = min(len(token_ids), done + chunk_size)
        boundary = state.next_snapshot_position()
        if boundary is not None:
            end = min(end, done + boundary - state.offset)
        last = end == len(token_ids)
        logits = model.forward(token_ids[done:end], state, logits="last" if last else "none")
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
