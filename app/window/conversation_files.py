"""A conversation to and from a file the person picks: export as Markdown or JSON, every
chat as one JSON file, import JSON. What a file holds is app.conversation.store_io's
business; this adds the file dialogs and turns a file that cannot be read or written (a
full disk, a folder without write access) into a banner. The dialogs open where the
last export or import went, else in Documents (else the home folder), never in the
working directory the app happened to start in."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QSettings, QStandardPaths, Signal
from PySide6.QtWidgets import QFileDialog, QWidget

from app.conversation.store import ConversationStore
from app.conversation.store_io import ExportFormat, read_import, write_export, write_export_all
from app.window.banner import Banner

FOLDER_KEY = "files/last_folder"  # where the last export or import went


class ConversationFiles(QObject):
    imported = Signal(str)  # the new conversation's id

    def __init__(
        self,
        store: ConversationStore,
        banner: Banner,
        dialog_parent: QWidget,
        qsettings: QSettings | None = None,
    ) -> None:
        super().__init__(dialog_parent)
        self.store, self.banner = store, banner
        self._dialog_parent = dialog_parent
        self._qsettings = qsettings

    def start_folder(self) -> Path:
        saved = self._qsettings.value(FOLDER_KEY, "") if self._qsettings is not None else ""
        if saved and Path(str(saved)).is_dir():
            return Path(str(saved))
        location = QStandardPaths.StandardLocation.DocumentsLocation
        documents = QStandardPaths.writableLocation(location)
        return Path(documents) if documents and Path(documents).is_dir() else Path.home()

    def _remember_folder(self, path: str) -> None:
        if self._qsettings is not None:
            self._qsettings.setValue(FOLDER_KEY, str(Path(path).parent))

    def _written(self, path: str | Path, write: Callable[[], int | None]) -> int | None:
        """What `write` returns, or None where the file could not be written (the banner
        says why: a full disk, a folder without write access)."""
        try:
            return write()
        except OSError as error:
            self.banner.show_error(f"Could not export to {Path(path).name}.", str(error))
            return None

    def export_conversation(self, conversation_id: str, fmt: str, path: str | Path) -> None:
        self._written(path, lambda: write_export(self.store, conversation_id, fmt, path))

    def export_all(self, path: str | Path) -> int | None:
        """Every chat into one JSON file; how many, or None (the banner says why)."""
        count = self._written(path, lambda: write_export_all(self.store, path))
        if count is None:
            return None
        chats = "1 chat" if count == 1 else f"{count} chats"
        self.banner.show_notice(f"Exported {chats} to {Path(path).name}.", timeout_ms=5000)
        return count

    def import_conversation(self, path: str | Path) -> str | None:
        """The imported conversation's id, or None (the banner says why)."""
        try:
            conversation = read_import(self.store, path)
        except (OSError, ValueError, KeyError, TypeError) as error:
            self.banner.show_error(f"Could not import {Path(path).name}.", str(error))
            return None
        self.imported.emit(conversation.id)
        return conversation.id

    def export_dialog(self, conversation_id: str, fmt: str) -> None:
        conversation = self.store.get_conversation(conversation_id)
        is_json = fmt == ExportFormat.JSON
        suffix, kind = (".json", "JSON (*.json)") if is_json else (".md", "Markdown (*.md)")
        title = conversation.title if conversation is not None else ""
        name = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in title)
        suggested = str(self.start_folder() / (name + suffix))
        path, _ = QFileDialog.getSaveFileName(
            self._dialog_parent, "Export conversation", suggested, kind
        )
        if path:
            self._remember_folder(path)
            self.export_conversation(conversation_id, fmt, path)

    def export_all_dialog(self) -> None:
        suggested = self.start_folder() / f"branchchat-chats-{time.strftime('%Y-%m-%d')}.json"
        path, _ = QFileDialog.getSaveFileName(
            self._dialog_parent, "Export all chats", str(suggested), "JSON (*.json)"
        )
        if path:
            self._remember_folder(path)
            self.export_all(path)

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self._dialog_parent, "Import conversation", str(self.start_folder()), "JSON (*.json)"
        )
        if path:
            self._remember_folder(path)
            self.import_conversation(path)
