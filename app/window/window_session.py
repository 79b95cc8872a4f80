"""The window as the person left it: its geometry, the sidebar's width and the open chat,
kept in QSettings beside the settings; the last model is AppSettings.recent_models[0].
A chat deleted since, or a model file gone, falls back to a new chat / the default
model without a word: nothing the person did is lost by it."""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import QMainWindow, QSplitter

GEOMETRY_KEY = "window/geometry"
SPLITTER_KEY = "window/splitter"
OPEN_CHAT_KEY = "window/open_conversation"


class WindowSession:
    def __init__(self, qsettings: QSettings, window: QMainWindow, splitter: QSplitter) -> None:
        self.qsettings, self.window, self.splitter = qsettings, window, splitter

    def save_open_chat(self, conversation_id: str | None) -> None:
        self.qsettings.setValue(OPEN_CHAT_KEY, conversation_id or "")

    def open_chat(self) -> str | None:
        value = self.qsettings.value(OPEN_CHAT_KEY, "")
        return str(value) if value else None

    def save_layout(self) -> None:
        self.qsettings.setValue(GEOMETRY_KEY, self.window.saveGeometry())
        self.qsettings.setValue(SPLITTER_KEY, self.splitter.saveState())
        self.qsettings.sync()

    def restore_layout(self) -> None:
        geometry = self.qsettings.value(GEOMETRY_KEY)
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.window.restoreGeometry(geometry)
        state = self.qsettings.value(SPLITTER_KEY)
        if isinstance(state, QByteArray) and not state.isEmpty():
            self.splitter.restoreState(state)
