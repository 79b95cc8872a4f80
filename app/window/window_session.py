"""The window as the person left it: its geometry, the sidebar's width (and whether it is
shown), the open chat and every chat's unsent draft, kept in QSettings beside the
settings; the last model is AppSettings.recent_models[0]. A chat deleted since, or a model
file gone, falls back to a new chat / the default model without a word: nothing the person
did is lost by it."""

from __future__ import annotations

import json

from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import QMainWindow, QSplitter

GEOMETRY_KEY = "window/geometry"
SPLITTER_KEY = "window/splitter"
OPEN_CHAT_KEY = "window/open_conversation"
DRAFTS_KEY = "window/drafts"  # JSON: conversation id ("" for a new chat) -> text
SIDEBAR_KEY = "window/sidebar_shown"  # View ▸ Show sidebar


class WindowSession:
    def __init__(self, qsettings: QSettings, window: QMainWindow, splitter: QSplitter) -> None:
        self.qsettings, self.window, self.splitter = qsettings, window, splitter

    def save_open_chat(self, conversation_id: str | None) -> None:
        self.qsettings.setValue(OPEN_CHAT_KEY, conversation_id or "")

    def open_chat(self) -> str | None:
        value = self.qsettings.value(OPEN_CHAT_KEY, "")
        return str(value) if value else None

    def save_drafts(self, drafts: dict[str, str]) -> None:
        self.qsettings.setValue(DRAFTS_KEY, json.dumps(drafts))

    def drafts(self) -> dict[str, str]:
        try:
            saved = json.loads(str(self.qsettings.value(DRAFTS_KEY, "{}")))
        except ValueError:
            return {}
        if not isinstance(saved, dict):
            return {}
        return {str(k): v for k, v in saved.items() if isinstance(v, str)}

    def save_sidebar_shown(self, shown: bool) -> None:
        self.qsettings.setValue(SIDEBAR_KEY, shown)

    def sidebar_shown(self) -> bool:
        return str(self.qsettings.value(SIDEBAR_KEY, True)).lower() not in ("false", "0")

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
