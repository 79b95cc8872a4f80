"""The persistent prompt cache: a conversation's computed state saved to disk.

One file per conversation under a per-model folder (named by the model's fingerprint,
engine/fingerprint.py), so a later engine given the same branch loads it and prefills
only new tokens. Files from another model, corrupt or truncated ones, are detected,
logged and ignored (and removed): the request prefills afresh. Total size is bounded;
the least recently used files go first. A state already on disk is not written again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from pathlib import Path

from engine.errors import StateError
from engine.sequence import SequenceState
from engine.state_io import StatefulModel, load_state, save_state

log = logging.getLogger(__name__)


class PromptCache:
    def __init__(self, root: Path, fingerprint: str, max_bytes: int = 2 << 30) -> None:
        self.root = Path(root)
        self.dir = self.root / fingerprint[:16]
        self.fingerprint = fingerprint
        self.max_bytes = max_bytes
        self._on_disk: dict[str, list[int]] = {}  # the tokens each file holds, as last seen

    def is_saved(self, conversation_id: str, state: SequenceState) -> bool:
        """Whether the file for `conversation_id` already holds `state`'s tokens."""
        saved = self._on_disk.get(conversation_id)
        return saved == state.tokens and self.path_for(conversation_id).is_file()

    def path_for(self, conversation_id: str) -> Path:
        digest = hashlib.sha1(conversation_id.encode()).hexdigest()[:20]
        return self.dir / f"{digest}.safetensors"

    def save(self, conversation_id: str, state: SequenceState) -> tuple[str, int] | None:
        if not state.offset:
            return None
        path = self.path_for(conversation_id)
        if self.is_saved(conversation_id, state):
            return str(path), path.stat().st_size
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            size = save_state(state, path, self.fingerprint)
        except (StateError, OSError) as exc:
            log.warning("could not save the prompt cache: %s", exc)
            return None
        self._on_disk[conversation_id] = list(state.tokens)
        self._evict(keep=path)
        return str(path), size

    def load(self, conversation_id: str, model: StatefulModel) -> SequenceState | None:
        path = self.path_for(conversation_id)
        if not path.is_file():
            return None
        try:
            state = load_state(model, path, self.fingerprint)
        except StateError as exc:
            log.warning("ignoring prompt cache file %s: %s", path, exc)
            path.unlink(missing_ok=True)
            self._on_disk.pop(conversation_id, None)
            return None
        os.utime(path)  # recently used
        self._on_disk[conversation_id] = list(state.tokens)
        return state

    def _evict(self, keep: Path) -> None:
        """Least recently used first, until every model's files together fit `max_bytes`
        (the bound is the folder's, not each model's: a user may try many models)."""
        files = []
        for path in self.root.glob("*/*.safetensors"):
            with contextlib.suppress(OSError):  # removed by another process meanwhile
                st = path.stat()
                files.append((st.st_mtime_ns, st.st_size, path))
        files.sort()
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total <= self.max_bytes:
                break
            if path != keep:
                total -= size
                path.unlink(missing_ok=True)
