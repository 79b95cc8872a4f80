"""The main window: sidebar | model header, banner, chat, composer. It wires the widgets
to the chat controller, the model loader and the conversation files, and owns the
settings and the theme."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QAction, QCloseEvent, QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QMainWindow,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.bridge import EngineBridge
from app.chat.chat_controller import ChatController
from app.chat.chat_settings_editor import ChatSettingsEditor
from app.chat.chat_view import ChatView
from app.chat.composer import Composer
from app.chat.composer_drafts import ComposerDrafts
from app.conversation.store import ConversationStore
from app.models.hub_dialog import HubDownloadDialog, show_hub_download
from app.models.model_header import ModelHeader
from app.models.model_loader import ModelLoader
from app.remote.connector import RemoteConnector
from app.settings.app_settings import AppSettings, load_settings, save_settings
from app.settings.settings_dialog import SettingsDialog
from app.sidebar.sidebar import Sidebar
from app.theme import Theme, apply_theme, system_theme
from app.window.app_icon import app_icon
from app.window.appearance import chosen, theme_for
from app.window.banner import Banner
from app.window.conversation_files import ConversationFiles
from app.window.file_drop import FileDrop
from app.window.menus import build_menu_bar
from app.window.message_delete import delete_message
from app.window.text_size import apply_text_size
from app.window.window_session import WindowSession
from engine.events import Failed, ModelLoaded
from engine.remote.connection import REMOTE_FAMILY

APP_TITLE = "branchchat"


class MainWindow(QMainWindow):
    sidebar_action: QAction  # View ▸ Show sidebar (menus.build_menu_bar makes it)

    def __init__(
        self,
        store: ConversationStore,
        bridge: EngineBridge,
        qsettings: QSettings,
        theme: Theme | None = None,
    ) -> None:
        super().__init__()
        self.setWindowTitle(APP_TITLE)
        self.setWindowIcon(app_icon())
        self.resize(1200, 800)
        self.store, self.bridge, self.qsettings = store, bridge, qsettings
        self.settings: AppSettings = load_settings(qsettings)
        # View ▸ Appearance's choice; where it is the system's, `theme` stands in for it
        self.theme = theme_for(chosen(qsettings), theme)
        self._follows_system = theme is None
        self.controller = ChatController(store, bridge, lambda: self.settings, self)

        self.sidebar = Sidebar(self.theme, self)
        self.header = ModelHeader(lambda: self.settings.recent_models, self)
        self.banner = Banner(self)
        self.chat = ChatView(self.controller.model, self.theme, self)
        self.chat.delegate.set_tint_drafted(self.settings.tint_drafted)
        self.composer = Composer(self)
        self.composer.set_send_key(self.settings.send_key)
        self.chat.delegate.is_save = self.composer.edit.is_send  # an edit saves as it sends
        apply_text_size(self, self.settings.text_size)
        right = QWidget(self)
        right.setObjectName("chatPane")
        column = QVBoxLayout(right)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        for widget, stretch in ((self.header, 0), (self.banner, 0), (self.chat, 1)):
            column.addWidget(widget, stretch)
        column.addWidget(self.composer)
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(self.sidebar)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([260, 940])
        splitter.setChildrenCollapsible(False)
        self.sidebar.setMinimumWidth(200)
        self.setCentralWidget(splitter)
        self.window_session = WindowSession(qsettings, self, splitter)
        self.hub_dialog: HubDownloadDialog | None = None  # made when first asked for
        self.model_loader = ModelLoader(bridge, self.header, lambda: self.settings, self)
        self.remote = RemoteConnector(bridge, self.header, qsettings, self)
        self.remote.notice.connect(lambda text: self.banner.show_notice(text, timeout_ms=15000))
        self.conversation_files = ConversationFiles(store, self.banner, self, qsettings)
        self.drafts = ComposerDrafts(self.composer)
        fields = (self.composer.edit.viewport(), self.sidebar.search)
        load, import_chat = self.model_loader.load, self.conversation_files.import_conversation
        self.file_drop = FileDrop(self, fields, load, import_chat)
        self._is_sending = False  # a send may create the chat its draft was typed in
        self.chat_settings = ChatSettingsEditor(store, self.controller, lambda: self.settings, self)
        self.header.chat_settings_requested.connect(self.chat_settings.open_dialog)
        self.header.download_requested.connect(self.open_hub_download)
        self.chat_settings.changed.connect(self.header.show_chat_settings)
        self.chat_settings.failed.connect(self.banner.show_error)
        self._connect()
        self._shortcuts()
        build_menu_bar(self)
        self.refresh_sidebar()
        self.composer.edit.setFocus()  # typing goes to the message box from the start
        if chosen(qsettings) != "system":
            self.set_theme(self.theme)  # the application's palette too
        if self._follows_system:
            QGuiApplication.styleHints().colorSchemeChanged.connect(self._on_scheme_changed)

    def _connect(self) -> None:
        c = self.controller
        self.composer.send_requested.connect(self._send)
        self.composer.stop_requested.connect(c.stop)
        self.composer.edit_last_requested.connect(self.edit_last_user_message)
        c.busy_changed.connect(self.composer.set_generating)
        c.busy_changed.connect(lambda busy: busy or self.banner.resolve("send"))
        c.status_line.connect(self.composer.set_status)
        c.prefill_progress.connect(self.composer.set_prefill)
        c.bridge.model_loaded.connect(self.composer.show_model)
        c.conversations_changed.connect(self.refresh_sidebar)
        c.conversation_changed.connect(self.sidebar.set_current)
        c.conversation_changed.connect(self._on_conversation_changed)
        c.conversations_changed.connect(self._update_title)
        c.reveal_message.connect(self.chat.list_view.scroll_to_message)
        self.chat.edit_saved.connect(self._save_edit)
        c.store_failed.connect(self.banner.show_error)
        # why a send was not taken; it goes once the reason does (a model loads, the
        # reply ends)
        c.send_refused.connect(lambda why: self.banner.show_notice(why, topic="send"))
        self.chat.copied.connect(
            lambda: self.banner.show_notice("Copied the message to the clipboard.", timeout_ms=2000)
        )
        self.chat.action_triggered.connect(self._on_message_action)
        self.sidebar.new_chat_requested.connect(self.new_chat)
        self.sidebar.conversation_selected.connect(self._open)
        self.sidebar.search_hit_selected.connect(lambda cid, mid: self._open(cid, mid))
        self.sidebar.search_changed.connect(lambda _query: self.refresh_sidebar())
        self.sidebar.rename_requested.connect(self._rename)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.export_requested.connect(self.conversation_files.export_dialog)
        self.sidebar.import_requested.connect(self.conversation_files.import_dialog)
        self.conversation_files.imported.connect(self._on_imported)
        self.header.settings_requested.connect(self.open_settings)
        self.model_loader.loaded.connect(self._on_model_loaded)
        self.model_loader.fetch_failed.connect(
            lambda message, details: self.banner.show_error(message, details, topic="model")
        )
        self.model_loader.settings_changed.connect(self.save_settings)
        self.model_loader.memory_report.connect(self.composer.status.setToolTip)
        self.bridge.failed.connect(self._on_failed)
        self.bridge.finished.connect(lambda _event: self.banner.resolve("request"))

    def _shortcuts(self) -> None:
        find = QShortcut(QKeySequence.StandardKey.Find, self, activated=self.search_messages)
        find.setWhatsThis("Search all messages")  # its name in Help > Keyboard shortcuts
        # Esc stops a reply; while none streams it is left to the widgets (cancel a rename).
        self.stop_shortcut = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        self.stop_shortcut.setWhatsThis("Stop the reply")
        self.stop_shortcut.activated.connect(self.controller.stop)
        self.stop_shortcut.setEnabled(False)
        self.controller.busy_changed.connect(self.stop_shortcut.setEnabled)

    # -- conversations ----------------------------------------------------------------

    def refresh_sidebar(self) -> None:
        query = self.sidebar.query
        if query:
            self.sidebar.show_hits(self.store.search(query))
        else:
            self.sidebar.show_conversations(self.store.list_conversations())

    def new_chat(self) -> None:
        self.chat.end_edit()
        self.controller.new_chat()
        self.composer.edit.setFocus()

    def _open(self, conversation_id: str, message_id: str | None = None) -> None:
        self.chat.end_edit()
        self.controller.open_conversation(conversation_id, reveal=message_id)

    def _send(self, text: str) -> None:
        self._is_sending = True
        try:
            sent = self.controller.send(text)
        finally:
            self._is_sending = False
        if sent:
            self.composer.clear()

    def _save_edit(self, message_id: str, text: str) -> None:
        c = self.controller
        if c.edit_message(message_id, text) or not (c.last_store_error or c.last_refusal):
            return
        if self.chat.begin_edit(message_id):  # not saved: the text goes back in the editor
            editor = self.chat.editor()
            if editor is not None:
                editor.text_edit.setPlainText(text)

    def _rename(self, conversation_id: str, title: str) -> None:
        try:
            self.store.rename_conversation(conversation_id, title)
        except sqlite3.Error as exc:
            self.banner.show_error(f"Could not rename the conversation: {exc}.", repr(exc))
        self.refresh_sidebar()
        self._update_title()

    def _on_conversation_changed(self, conversation_id: str | None) -> None:
        if self._is_sending and self.drafts.conversation_id is None:
            self.drafts.adopt(conversation_id)  # the first message created this chat
        else:
            self.drafts.switch(conversation_id)
        self.window_session.save_open_chat(conversation_id)
        self._update_title()

    def _update_title(self) -> None:
        cid = self.controller.conversation_id
        conversation = self.store.get_conversation(cid) if cid is not None else None
        self.setWindowTitle(f"{conversation.title} - {APP_TITLE}" if conversation else APP_TITLE)

    def open_hub_download(self) -> None:
        """Model ▸ Download from Hugging Face…: the file lands in the models folder and
        loads once it is checked."""
        if self.hub_dialog is None:  # one dialog, which keeps its list between visits
            self.hub_dialog = show_hub_download(self, self.model_loader.load)
        else:
            self.hub_dialog.open()
            self.hub_dialog.raise_()

    def export_open_chat(self, fmt: str) -> None:
        if self.controller.conversation_id is not None:
            self.conversation_files.export_dialog(self.controller.conversation_id, fmt)

    # -- the session as it was left ---------------------------------------------------

    def search_messages(self) -> None:
        """Ctrl+F: the sidebar's search box, the sidebar shown first where it was hidden."""
        self.show_sidebar(True)
        self.sidebar.focus_search()

    def show_sidebar(self, shown: bool) -> None:
        """View ▸ Show sidebar (its check mark follows), kept for the next start."""
        self.sidebar.setVisible(shown)
        self.sidebar_action.setChecked(shown)
        self.window_session.save_sidebar_shown(shown)

    def restore_session(self) -> None:
        """The window's size, the sidebar's width and whether it is shown, the chat left
        open and the drafts."""
        self.window_session.restore_layout()
        self.show_sidebar(self.window_session.sidebar_shown())
        self.drafts.restore(self.window_session.drafts())
        conversation_id = self.window_session.open_chat()
        if conversation_id is not None and self.store.get_conversation(conversation_id):
            self._open(conversation_id)

    def load_startup_model(self, exists: Callable[[str], bool] = os.path.exists) -> None:
        """The model loaded last, while its file is still there; else the default."""
        recent = self.settings.recent_models
        if recent and exists(recent[0]):
            self.model_loader.load(recent[0])
        else:
            self.model_loader.load_default_model()

    def delete_conversation(self, conversation_id: str) -> None:
        conversation = self.store.get_conversation(conversation_id)
        if conversation is None:
            return
        active = self.controller.active
        if active is not None and active.conversation_id == conversation_id:
            self.controller.stop()
        try:
            self.store.delete_conversation(conversation_id)
        except sqlite3.Error as exc:
            self.banner.show_error(f"Could not delete the conversation: {exc}.", repr(exc))
            return
        if self.controller.conversation_id == conversation_id:
            self.controller.new_chat()
        self.refresh_sidebar()
        undo = ("Undo", lambda: self.undo_delete(conversation_id))
        self.banner.show_notice(f"Deleted “{conversation.title}”.", undo, timeout_ms=10000)

    def undo_delete(self, conversation_id: str) -> None:
        self.store.restore_conversation(conversation_id)
        self.refresh_sidebar()
        self._open(conversation_id)

    def edit_last_user_message(self) -> None:
        message_id = self.controller.last_user_message_id()
        if message_id is not None:
            self.chat.begin_edit(message_id)

    def _on_message_action(self, message_id: str, action: str, _argument: object) -> None:
        c = self.controller
        if action in ("prev", "next"):
            c.switch_branch(message_id, -1 if action == "prev" else 1)
        elif action == "regenerate":
            c.regenerate(message_id)
        elif action == "continue":
            c.continue_message(message_id)
        elif action == "retry":
            c.retry(message_id)
        elif action == "branch":
            c.branch_into_new_chat(message_id)
        elif action == "delete":
            delete_message(self, message_id)

    def _on_imported(self, conversation_id: str) -> None:
        self.refresh_sidebar()
        self._open(conversation_id)

    # -- engine events (the header shows the model's; see ModelLoader) -----------------

    def _on_model_loaded(self, event: ModelLoaded) -> None:
        self.controller.context_length = event.context_length
        self.banner.resolve("model")
        self.banner.resolve("send")
        if event.family != REMOTE_FAMILY:  # a server's URL is the connection's, not a file
            self.save_settings(self.settings.with_recent_model(event.path))

    def _on_failed(self, event: Failed) -> None:
        # a request's failure clears with the next reply, a load's with the next load
        topic = "request" if event.request_id else "model"
        self.banner.show_error(event.message, event.details, topic=topic)

    # -- settings and theme -----------------------------------------------------------

    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self)
        if dialog.exec():
            self.apply_settings(dialog.result_settings())

    def apply_settings(self, settings: AppSettings) -> None:
        old, self.settings = self.settings, settings
        self.save_settings(settings)
        self.chat.delegate.set_tint_drafted(settings.tint_drafted)
        self.composer.set_send_key(settings.send_key)
        self.chat.list_view.doItemsLayout()
        self.model_loader.apply_settings(old, settings)

    def save_settings(self, settings: AppSettings) -> None:
        """Keep `settings` (those the window applies itself, as the text size)."""
        self.settings = settings
        save_settings(self.qsettings, settings)

    def _on_scheme_changed(self, _scheme) -> None:
        if chosen(self.qsettings) == "system":
            self.set_theme(system_theme())

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        app = QApplication.instance()
        if isinstance(app, QApplication):
            apply_theme(app, theme)
        self.chat.set_theme(theme)
        self.sidebar.set_theme(theme)

    # -- shutdown ---------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:
        self.window_session.save_drafts(self.drafts.snapshot())
        self.window_session.save_layout()
        self.controller.shutdown()
        self.bridge.close()
        super().closeEvent(event)
