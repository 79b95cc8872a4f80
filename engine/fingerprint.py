"""What a saved state's numbers depend on, as one key: the prompt cache loads a state
only into a session whose key is the same.

Two parts:

- the weights: a SHA-256 over every byte of every file the model is read from (a
  LoRA-merged fine-tune of the same base differs from it only deep inside the tensors,
  so a digest of headers or sizes lets one model load the other's state), plus the
  config the loader derived from them (a newer loader reading the same bytes differently
  computes other numbers);
- the compute path: backend, dtype, the K/V rows' dtype, device, the CPU's packed kernel
  or BLAS and the kernel's arithmetic (int8 or float), the C step, the fused CUDA step and
  its mode. A float32 CPU state is not a bfloat16 GPU
  state, and two paths round differently even in one dtype.

Hashing a model file streams it once (~1 GB/s); the digest is kept in a small JSON file
keyed by the file's absolute path, size, mtime and ctime, so later loads of an unchanged
file read none of it. ctime is in the key because tools that rewrite a file in place can
keep its mtime (cp -p, rsync -t, tar), and ctime cannot be set back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DIGEST_CACHE_NAME = "weight-digests.json"
_MAX_ENTRIES = 256  # a few hundred model files; entries of deleted files go first
_CHUNK = 8 << 20


class DigestCache:
    """SHA-256 digests of files, remembered in `path` (None: remembered in memory only,
    for this object's life) while a file's size, mtime and ctime stay the same."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] | None = None

    def digest(self, file: Path) -> str:
        """The SHA-256 of `file`'s bytes, hashing it only when the cache has no entry for
        this version of it (OSError when the file cannot be read)."""
        file = file.resolve()
        entries = self._load()
        stamp = _stamp(file)
        entry = entries.get(str(file))
        if entry is not None and entry.get("stamp") == stamp:
            return str(entry["sha256"])
        digest = hash_file(file)
        if _stamp(file) != stamp:  # written to while being hashed: do not remember it
            return digest
        entries[str(file)] = {"stamp": stamp, "sha256": digest}
        self._store(entries)
        return digest

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def _read(self) -> dict[str, dict[str, Any]]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:  # rebuilt from the files themselves
            log.warning("ignoring the weight digest cache %s: %s", self.path, exc)
            return {}
        return entries if isinstance(entries, dict) else {}

    def _store(self, entries: dict[str, dict[str, Any]]) -> None:
        if self.path is None:
            return
        # another process may have added entries since this one read the file
        merged = {**self._read(), **entries}
        live = {name: e for name, e in merged.items() if Path(name).exists()}
        kept = dict(list(live.items())[-_MAX_ENTRIES:])
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(kept, indent=0))
            os.replace(tmp, self.path)  # readers see the old file or the new one, never half
        except OSError as exc:  # only a cost: the next load hashes again
            log.warning("could not write the weight digest cache %s: %s", self.path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        self._entries = kept


def hash_file(file: Path) -> str:
    """SHA-256 over every byte of `file`, streamed in 8 MiB reads."""
    h = hashlib.sha256()
    with open(file, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _stamp(file: Path) -> list[int]:
    st = file.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def weights_key(files: Sequence[Path], config: Any, cache: DigestCache) -> str:
    """The weights' part of the key: every file's name and digest, and the model config."""
    h = hashlib.sha256(repr(sorted(vars(config).items())).encode())
    for file in files:
        h.update(f"{file.name}:{cache.digest(file)};".encode())
    return h.hexdigest()


def compute_key(runner: Any) -> str:
    """The compute path's part of the key, as text (it is also written into every file)."""
    import mlx.core as mx

    from engine.kv_state import dtype_name  # loads NumPy, like the caller's runner

    ops = runner.ops
    dtype = getattr(ops.dtype, "__name__", None) or str(ops.dtype)  # NumPy's type, MLX's Dtype
    parts = [ops.name, dtype.removeprefix("mlx.core.")]
    kv_dtype = dtype_name(ops.kv_dtype)
    if kv_dtype != parts[1]:  # K/V rows stored narrower than the compute dtype
        parts.append(f"kv-{kv_dtype}")
    if ops.name == "mlx":
        parts.append(str(mx.default_device()))
    packed = getattr(ops, "packed", None)  # the NumPy backend: C kernel on packed weights
    if packed is not None:
        parts.append("packed" if packed else "dense")
        if packed:  # int8 activations or float32 in registers: other numbers
            parts.append(f"matmul-{getattr(ops, 'cpu_matmul', 'float')}")
    if getattr(runner, "cpu_step", None) is not None:  # its rows round apart from per-op ones
        parts.append("cpu-step")
    fused = runner.fused
    if fused is None:
        parts.append("plain")
    else:
        parts.append(f"fused-{fused.mode}" + ("-compiled" if fused.compiled else ""))
    return "/".join(parts)


def fingerprint(weights: str, compute: str) -> str:
    """One key from both parts (32 hex digits)."""
    return hashlib.sha256(f"{weights}|{compute}".encode()).hexdigest()[:32]
