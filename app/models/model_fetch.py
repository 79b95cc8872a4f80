"""Fetches a shipped model (engine/model_catalog.py) on a worker thread; progress and the
outcome come back to the GUI thread as signals (queued, because they are emitted from the
worker)."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal

from engine.errors import EngineError
from engine.model_catalog import DEFAULT, CatalogModel, ensure_model


class ModelFetcher(QObject):
    progress = Signal(str, str, float)  # the model's title, what is happening, fraction done
    ready = Signal(str)  # the model's path
    failed = Signal(str, str)  # the model's title, why

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._thread: threading.Thread | None = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, model: CatalogModel = DEFAULT) -> None:
        """Fetch `model` unless a fetch is under way (one at a time: they share the disk)."""
        if self.is_running:
            return
        self._thread = threading.Thread(
            target=self._run, args=(model,), name=f"fetch-{model.name}", daemon=True
        )
        self._thread.start()

    def _run(self, model: CatalogModel) -> None:
        try:
            path = ensure_model(
                model, lambda text, done: self.progress.emit(model.title, text, done)
            )
        except (EngineError, OSError) as error:
            self.failed.emit(model.title, str(error))
        else:
            self.ready.emit(str(path))
