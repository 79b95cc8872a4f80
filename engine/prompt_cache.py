"""The persistent prompt cache: a conversation's computed state saved to disk.

One file per conversation under a per-model folder, so a later engine given the same
branch loads it and prefills only new tokens. Files from another model, or corrupt
ones, are detected, logged and ignored (and removed). Total size is bounded; the least
recently used files go first.
"""

from __future__ import annotations

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
        self.dir = Path(root) / fingerprint[:16]
        self.fingerprint = fingerprint
        self.max_bytes = max_bytes

    def path_for(self, conversation_id: str) -> Path:
        digest = hashlib.sha1(conversation_id.encode()).hexdigest()[:20]
        return self.dir / f"{digest}.safetensors"

    def save(self, conversation_id: str, state: SequenceState) -> tuple[str, int] | None:
        if not state.offset:
            return None
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.path_for(conversation_id)
        try:
            size = save_state(state, path, self.fingerprint)
        except StateError as exc:
            log.warning("could not save the prompt cache: %s", exc)
            return None
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
            return None
        os.utime(path)  # recently used
        return state

    def _evict(self, keep: Path) -> None:
        files = sorted(self.dir.glob("*.safetensors"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        for path in files:
            if total <= self.max_bytes:
                break
            if path != keep:
                total -= path.stat().st_size
                path.unlink(missing_ok=True)
