"""Fetches the default model on a worker thread; progress and the outcome come back to
the GUI thread as signals (queued, because they are emitted from the worker)."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal

from engine.default_model import ensure_default_model
from engine.errors import EngineError


class DefaultModelFetcher(QObject):
    progress = Signal(str)
    ready = Signal(str)  # the model's path
    failed = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.is_running:
            return
        self._thread = threading.Thread(target=self._run, name="fetch-default-model", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            path = ensure_default_model(progress=self.progress.emit)
        except (EngineError, OSError) as error:
            self.failed.emit(str(error))
        else:
            self.ready.emit(str(path))
