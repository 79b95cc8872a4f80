"""Save a sequence's computed state to disk and load it back bit-exact.

One safetensors file holds every distinct array once (named a0, a1, ...; arrays shared
between the live state and its snapshots stay shared) and, in the file's string metadata,
a JSON header: format version, model fingerprint, the K/V rows' dtype, tokens, each
layer's kind, length and arrays, the snapshot stores with their per-layer arrays, and the
snapshot policy. A state is loaded only into an engine keeping K/V in the same dtype:
rounding float32 rows to float16, or widening float16 ones, would not give the rows a
fresh prefill there computes. A SHA-256
over the header and every array's bytes sits beside it: safetensors checks only its own
header, so a flipped data byte would otherwise load as a plausible but wrong state.

Writes are atomic (a temporary file in the same directory, fsync, os.replace): a crash or
a full disk never leaves a half-written file, and the previous file stays as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, Protocol

import mlx.core as mx
import numpy as np

from engine.errors import StateError
from engine.kv_state import dtype_name
from engine.sequence import SequenceState
from engine.state import SnapshotPolicy
from kernels.ops import Ops

FORMAT = "branchchat-sequence-state"
VERSION = 1
_HEADER_KEY = "branchchat_state"
_DIGEST_KEY = "branchchat_sha256"


class StatefulModel(Protocol):
    @property
    def ops(self) -> Ops: ...

    def new_state(self, policy: SnapshotPolicy | None = None) -> SequenceState: ...


def save_state(state: SequenceState, path: str | Path, fingerprint: str) -> int:
    """Write `state` to `path` for the model with `fingerprint`; returns the bytes written."""
    path = Path(path)
    if state.is_poisoned:
        raise StateError(f"cannot save to {path}: a failed forward left the state inconsistent")
    if state.is_recording:
        raise StateError(f"cannot save to {path}: a verify is open; commit or roll it back")
    arrays = _ArrayTable()
    layers = []
    for layer in state.layers:
        named = {key: arrays.add(value) for key, value in layer.arrays().items()}
        layers.append({"kind": layer.kind, "length": layer.length, "arrays": named})
    snapshots = [
        {"store": store, "position": pos, "layers": [arrays.add_snap(s) for s in snaps]}
        for store, pos, snaps in state.snapshot_items()
    ]
    header = json.dumps(
        {
            "format": FORMAT,
            "version": VERSION,
            "fingerprint": fingerprint,
            "backend": state.ops.name,
            "kv_dtype": dtype_name(state.ops.kv_dtype),
            "tokens": [int(t) for t in state.tokens],
            "policy": dataclasses.asdict(state.policy),
            "layers": layers,
            "snapshots": snapshots,
        },
        separators=(",", ":"),
    )
    tensors = arrays.tensors()
    metadata = {_HEADER_KEY: header, _DIGEST_KEY: _digest(header, tensors)}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            _write_safetensors(f, tensors, metadata)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        return path.stat().st_size
    except OSError as exc:
        raise StateError(f"could not save the state to {path}: {exc.strerror or exc}") from exc
    finally:
        _remove_quietly(tmp)


def load_state(model: StatefulModel, path: str | Path, fingerprint: str) -> SequenceState:
    """A new state for `model` from a file `save_state` wrote for the same fingerprint."""
    path = Path(path)
    if not path.is_file():
        raise StateError(f"{path}: no such state file")
    try:
        loaded: Any = mx.load(str(path), format="safetensors", return_metadata=True)
        tensors, metadata = loaded
    except Exception as exc:  # MLX reports truncation and corruption as plain errors
        raise StateError(f"{path}: corrupt or truncated state file ({exc})") from None
    header = metadata.get(_HEADER_KEY)
    if header is None:
        raise StateError(f"{path}: not a saved sequence state (no {_HEADER_KEY!r} metadata)")
    try:
        meta = json.loads(header)
        version = int(meta["version"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(f"{path}: corrupt state file header ({exc})") from None
    if meta.get("format") != FORMAT or version != VERSION:
        raise StateError(f"{path}: unsupported state format {meta.get('format')!r} v{version}")
    if meta.get("fingerprint") != fingerprint:  # before reading any array
        raise StateError(
            f"{path}: saved for another model (fingerprint {meta.get('fingerprint')}); "
            f"this model's is {fingerprint}"
        )
    saved_kv, kv = meta.get("kv_dtype"), dtype_name(model.ops.kv_dtype)
    if saved_kv is not None and saved_kv != kv:  # (older files: each layer checks its rows)
        raise StateError(
            f"{path}: saved with K/V rows in {saved_kv}; this engine keeps them in {kv} "
            f"(BRANCHCHAT_KV_DTYPE={saved_kv} loads it)"
        )
    # The checksum runs beside the rebuild (hashlib releases the GIL; it is most of a
    # restart's load: ~90 ms of ~140 ms for a 92 MB state). The rebuilt state is a new
    # object, returned only once the checksum matches.
    views = _array_views(tensors)  # reads the arrays from the file, on this thread
    with ThreadPoolExecutor(max_workers=1) as pool:
        digest = pool.submit(_hash, header, views)
        try:
            state, error = _rebuild(model, meta, tensors), None
        except (StateError, KeyError, TypeError, ValueError, IndexError) as exc:
            state, error = None, exc
        if digest.result() != metadata.get(_DIGEST_KEY):
            raise StateError(f"{path}: corrupt state file (checksum mismatch)")
    if state is None:
        raise StateError(f"{path}: inconsistent state file ({error})")
    return state


def _rebuild(model: StatefulModel, meta: dict, tensors: dict[str, Any]) -> SequenceState:
    state = model.new_state(SnapshotPolicy(**meta["policy"]))
    kinds = [layer.kind for layer in state.layers]
    saved_kinds = [entry["kind"] for entry in meta["layers"]]
    if kinds != saved_kinds:
        raise ValueError(f"its layers {saved_kinds} do not match this model's {kinds}")
    tokens = [int(t) for t in meta["tokens"]]
    table = _LoadedArrays(tensors, state.ops.name)
    for layer, entry in zip(state.layers, meta["layers"], strict=True):
        if int(entry["length"]) != len(tokens):
            raise ValueError(f"a layer holds {entry['length']} of {len(tokens)} tokens")
        arrays = {key: table.get(name) for key, name in entry["arrays"].items()}
        layer.load_arrays(arrays, len(tokens))
    state.tokens = tokens
    for snap in meta["snapshots"]:
        snaps = tuple(table.get_snap(s) for s in snap["layers"])
        state.load_snapshot(int(snap["position"]), snap["store"], snaps)
    return state


def _write_safetensors(f: IO[bytes], tensors: dict[str, Any], metadata: dict[str, str]) -> None:
    # Through a Python file object: MLX's path form ignores write errors (a full disk
    # leaves a short file and no exception); the file object raises OSError.
    mx.save_safetensors(f, tensors, metadata)  # type: ignore[arg-type]


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:  # some filesystems cannot fsync a directory; the file itself is synced
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _digest(header: str, tensors: dict[str, Any]) -> str:
    return _hash(header, _array_views(tensors))


def _array_views(tensors: dict[str, Any]) -> list[tuple[bytes, memoryview]]:
    """Each array's name, dtype and shape, and its bytes, in name order: plain buffers
    that another thread may hash (no MLX call leaves the thread that owns the arrays)."""
    return [
        (f"{name}:{a.dtype}:{tuple(a.shape)}".encode(), memoryview(a))
        for name, a in sorted(tensors.items())
    ]


def _hash(header: str, views: list[tuple[bytes, memoryview]]) -> str:
    h = hashlib.sha256(header.encode())
    for label, data in views:
        h.update(label)
        h.update(data)
    return h.hexdigest()


class _ArrayTable:
    """Every distinct array (by identity) once, converted to a contiguous MLX array."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._arrays: dict[str, Any] = {}
        self._keep: list[Any] = []  # holds the originals so their ids stay unique

    def add(self, array: Any) -> str:
        name = self._names.get(id(array))
        if name is None:
            name = f"a{len(self._arrays)}"
            self._names[id(array)] = name
            self._keep.append(array)
            converted = mx.array(array) if isinstance(array, np.ndarray) else array
            self._arrays[name] = mx.contiguous(converted)
        return name

    def add_snap(self, snap: Any) -> Any:
        """A layer snapshot (None, an array, or a tuple of arrays / None) as JSON."""
        if snap is None:
            return None
        if isinstance(snap, tuple):
            return [None if a is None else self.add(a) for a in snap]
        return self.add(snap)

    def tensors(self) -> dict[str, Any]:
        mx.eval(list(self._arrays.values()))
        return self._arrays


class _LoadedArrays:
    """Arrays from the file in the backend's form: NumPy on the NumPy backend and for
    integer host metadata (ring positions), MLX arrays otherwise."""

    def __init__(self, tensors: dict[str, Any], backend: str) -> None:
        self._tensors = tensors
        self._backend = backend
        self._converted: dict[str, Any] = {}  # one object per name keeps sharing intact

    def get(self, name: str) -> Any:
        if name not in self._converted:
            a = self._tensors[name]
            if self._backend == "numpy" or mx.issubdtype(a.dtype, mx.integer):
                a = np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)
            self._converted[name] = a
        return self._converted[name]

    def get_snap(self, encoded: Any) -> Any:
        if encoded is None:
            return None
        if isinstance(encoded, list):
            return tuple(None if n is None else self.get(n) for n in encoded)
        return self.get(encoded)
