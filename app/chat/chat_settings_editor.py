"""Opening the chat settings for the chat on screen and saving what the person picks with
it. A chat not created yet (nothing sent) keeps the picks until its first message creates
it, then they are saved with it."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QDialog, QWidget

from app.chat.chat_controller import ChatController
from app.chat.chat_settings_dialog import ChatSettingsDialog
from app.conversation.chat_settings import (
    AppDefaults,
    ChatSettings,
    PresetLibrary,
    chat_settings_for,
)
from app.conversation.store import ConversationStore
from engine.events import ModelLoaded

PRESETS_FILE = "presets.json"  # beside the conversation store


class ChatSettingsEditor(QObject):
    changed = Signal(object)  # the ChatSettings now in force for the chat on screen
    failed = Signal(str, str)  # message, details: the settings could not be saved

    def __init__(
        self,
        store: ConversationStore,
        controller: ChatController,
        defaults: Callable[[], AppDefaults],
        dialog_parent: QWidget,
        presets_path: str | Path | None = None,
    ) -> None:
        super().__init__(dialog_parent)
        self.store, self.controller, self._defaults = store, controller, defaults
        self._dialog_parent = dialog_parent
        self.presets = PresetLibrary(presets_path or store.path.parent / PRESETS_FILE)
        self.model_context: int | None = None  # the loaded model's, shown in the dialog
        self.pending: ChatSettings | None = None  # picked for a chat not created yet
        self.dialog: ChatSettingsDialog | None = None  # while open
        controller.conversation_changed.connect(self._on_conversation_changed)
        controller.bridge.model_loaded.connect(self._on_model_loaded)

    def current(self) -> ChatSettings:
        """What the next request in the chat on screen uses."""
        conversation_id = self.controller.conversation_id
        if conversation_id is None and self.pending is not None:
            return self.pending
        return chat_settings_for(self.store, conversation_id, self._defaults())

    def open_dialog(self) -> None:
        conversation_id = self.controller.conversation_id
        conversation = self.store.get_conversation(conversation_id) if conversation_id else None
        title = conversation.title if conversation is not None else "new chat"
        dialog = ChatSettingsDialog(
            self.current(), self.presets, self.model_context, title, self._dialog_parent
        )
        self.dialog = dialog
        try:
            if dialog.exec() == QDialog.DialogCode.Accepted:
                self.apply(dialog.result_settings())
        finally:
            self.dialog = None
            dialog.deleteLater()

    def apply(self, settings: ChatSettings) -> None:
        conversation_id = self.controller.conversation_id
        if conversation_id is None:
            self.pending = settings
        else:
            self._save(conversation_id, settings)
        self.changed.emit(settings)

    def _save(self, conversation_id: str, settings: ChatSettings) -> bool:
        try:
            self.store.set_conversation_settings(conversation_id, settings.to_dict())
        except (sqlite3.Error, ValueError) as error:
            self.failed.emit(
                "Could not save the chat settings.", f"{type(error).__name__}: {error}"
            )
            return False
        return True

    def _on_model_loaded(self, event: ModelLoaded) -> None:
        self.model_context = event.context_length

    def _on_conversation_changed(self, conversation_id: str | None) -> None:
        pending, self.pending = self.pending, None
        is_new = conversation_id is not None and len(self.store.load_tree(conversation_id)) == 0
        if pending is not None and is_new and conversation_id is not None:
            # the first message created this chat: the picks made before it are its settings
            self._save(conversation_id, pending)
        elif pending is not None and conversation_id is None:
            self.pending = pending  # still no chat (New chat pressed again)
        self.changed.emit(self.current())
