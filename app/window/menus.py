"""The window's menu bar: File (new chat, import, export, settings, Quit with Ctrl+Q),
Chat (the last reply: chat_menu.py), Model (download from Hugging Face, connect to a
server, open a file or folder, the default model), View (the sidebar, the chat's text size)
and Help (keyboard shortcuts, About). Each entry calls what the window already does;
nothing here holds state."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMenu

from app.conversation.store_io import ExportFormat
from app.settings.app_settings import TEXT_SIZES
from app.window.appearance import build_appearance_menu
from app.window.chat_menu import build_chat_menu
from app.window.help_dialogs import open_about, open_shortcuts
from app.window.text_size import change_text_size

if TYPE_CHECKING:
    from app.window.main_window import MainWindow


def _add(menu: QMenu, text: str, slot: Callable[[], object], shortcut=None) -> QAction:
    action = menu.addAction(text)
    action.triggered.connect(lambda _checked=False: slot())
    if shortcut is not None:
        action.setShortcut(QKeySequence(shortcut))
    return action


def build_menu_bar(window: MainWindow) -> None:
    bar = window.menuBar()
    file_menu = bar.addMenu("&File")
    _add(file_menu, "New chat", window.new_chat, QKeySequence.StandardKey.New)
    _add(
        file_menu,
        "Import chats (branchchat, ChatGPT, Open WebUI)…",
        window.conversation_files.import_dialog,
    )
    export_md = _add(
        file_menu,
        "Export chat as Markdown…",
        lambda: window.export_open_chat(ExportFormat.MARKDOWN),
    )
    export_json = _add(
        file_menu, "Export chat as JSON…", lambda: window.export_open_chat(ExportFormat.JSON)
    )

    export_all = _add(
        file_menu, "Export all chats as JSON…", window.conversation_files.export_all_dialog
    )

    def enable_exports() -> None:
        has_chat = window.controller.conversation_id is not None
        export_md.setEnabled(has_chat)
        export_json.setEnabled(has_chat)
        export_all.setEnabled(bool(window.store.list_conversations()))

    file_menu.aboutToShow.connect(enable_exports)
    file_menu.addSeparator()
    _add(file_menu, "Settings…", window.open_settings, "Ctrl+,")
    file_menu.addSeparator()
    quit_action = _add(file_menu, "Quit", window.close, "Ctrl+Q")
    quit_action.setMenuRole(QAction.MenuRole.QuitRole)

    build_chat_menu(window, bar.addMenu("&Chat"), _add)

    loader = window.model_loader
    model_menu = bar.addMenu("&Model")
    _add(model_menu, "Choose a model…", window.header.open_picker)  # Ctrl+L: the header's
    _add(model_menu, "Download from Hugging Face…", window.open_hub_download)
    _add(model_menu, "Connect to server…", window.remote.open_dialog)  # app/remote/
    model_menu.addSeparator()
    _add(model_menu, "Open GGUF file…", loader.open_file, "Ctrl+O")
    _add(model_menu, "Open model folder…", loader.open_folder)
    _add(model_menu, "Default model (SmolLM2-135M-Instruct)", loader.load_default_model)

    view_menu = bar.addMenu("&View")  # the sidebar; the chat's text size (text_size.py)
    sidebar = window.sidebar_action = view_menu.addAction("Show sidebar")
    sidebar.setCheckable(True)
    sidebar.setChecked(True)
    sidebar.setShortcut(QKeySequence("Ctrl+Shift+S"))
    sidebar.toggled.connect(window.show_sidebar)
    build_appearance_menu(window, view_menu.addMenu("Appearance"))
    view_menu.addSeparator()

    def resize_text(by: int | None) -> None:
        change_text_size(window, by)
        enable_sizes()

    def enable_sizes() -> None:  # after each change: a disabled action's keys do nothing
        larger.setEnabled(window.settings.text_size < TEXT_SIZES[-1])
        smaller.setEnabled(window.settings.text_size > TEXT_SIZES[0])

    larger = _add(view_menu, "Larger text", lambda: resize_text(1))
    larger.setShortcuts([QKeySequence("Ctrl+="), QKeySequence(QKeySequence.StandardKey.ZoomIn)])
    smaller = _add(view_menu, "Smaller text", lambda: resize_text(-1))
    smaller.setShortcut(QKeySequence(QKeySequence.StandardKey.ZoomOut))
    _add(view_menu, "Actual size", lambda: resize_text(None), "Ctrl+0")
    enable_sizes()  # a size kept at a bound

    help_menu = bar.addMenu("&Help")
    _add(help_menu, "Keyboard shortcuts", lambda: open_shortcuts(window), "Ctrl+/")
    about = _add(help_menu, "About branchchat", lambda: open_about(window))
    about.setMenuRole(QAction.MenuRole.AboutRole)
