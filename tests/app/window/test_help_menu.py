"""The Help menu: Keyboard shortcuts lists the keys the window is bound to (read from its
actions, shortcuts and buttons as it opens, the composer's from Settings' send key), opened
from the menu or with Ctrl+/; About names the version, the loaded model and where the chats
are kept."""

from __future__ import annotations

import importlib.metadata

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QApplication

from app.window.help_dialogs import AboutDialog, ShortcutsDialog
from engine.events import ModelLoaded
from tests.app.chat.test_composer_keys import choose_in_settings
from tests.app.window.test_window_habits import menu_action


def open_dialog(qtbot, window, kind):
    """The one dialog of `kind` the window has open; it closes (and goes) at the test's end."""
    qtbot.waitUntil(lambda: bool(window.findChildren(kind)))
    (dialog,) = window.findChildren(kind)
    qtbot.waitExposed(dialog)
    qtbot.addWidget(dialog)
    return dialog


def test_keyboard_shortcuts_lists_every_bound_key(harness, qtbot):
    window = harness.open()
    menu_action(window, "Help", "Keyboard shortcuts").trigger()
    rows = open_dialog(qtbot, window, ShortcutsDialog).rows()
    native = QKeySequence.SequenceFormat.NativeText
    find = QKeySequence(QKeySequence.StandardKey.Find).toString(native)
    for row in [
        ("New chat", "Ctrl+N"),
        ("Settings", "Ctrl+,"),
        ("Quit", "Ctrl+Q"),
        ("Open GGUF file", "Ctrl+O"),
        ("Keyboard shortcuts", "Ctrl+/"),
        ("Search all messages", find),
        ("Stop the reply", "Esc"),
        ("Choose a model", "Ctrl+L"),
        ("Send the message", "Enter"),
        ("New line", "Shift+Enter"),
        ("Edit your last message (empty box)", "Up"),
        ("Save an edited message", "Enter"),
        ("Cancel an edit", "Esc"),
    ]:
        assert row in rows, rows
    assert len(rows) == len(set(rows)) and all(label for label, _ in rows), rows
    # a shortcut the list could not name would be left out of it
    assert all(shortcut.whatsThis() for shortcut in window.findChildren(QShortcut))


def test_the_list_follows_the_keys_as_they_are_bound(harness, qtbot):
    """A key rebound, and Settings' send key changed: the list opened next says so."""
    window = harness.open()
    menu_action(window, "File", "New chat").setShortcut(QKeySequence("Ctrl+Shift+N"))
    choose_in_settings(window, qtbot, "Ctrl+Enter sends")
    qtbot.waitUntil(lambda: window.settings.send_key == "ctrl_enter")
    menu_action(window, "Help", "Keyboard shortcuts").trigger()
    rows = open_dialog(qtbot, window, ShortcutsDialog).rows()
    assert ("New chat", "Ctrl+Shift+N") in rows and ("New chat", "Ctrl+N") not in rows
    assert ("Send the message", "Ctrl+Enter") in rows and ("New line", "Enter") in rows
    assert ("Save an edited message", "Ctrl+Enter") in rows


def test_ctrl_slash_opens_the_shortcuts(harness, qtbot):
    window = harness.open()
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.composer.edit)
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Slash, Qt.KeyboardModifier.ControlModifier)
    dialog = open_dialog(qtbot, window, ShortcutsDialog)
    assert dialog.windowTitle() == "Keyboard shortcuts"


def test_about_names_the_version_the_model_and_the_chats_file(harness, qtbot):
    window = harness.open(with_model=False)
    menu_action(window, "Help", "About").trigger()
    about = open_dialog(qtbot, window, AboutDialog)
    text = about.label.text()
    assert f"branchchat {importlib.metadata.version('branchchat')}" in text
    assert "Model: none loaded" in text and str(harness.db_path) in text
    about.close()
    qtbot.waitUntil(lambda: not window.findChildren(AboutDialog))
    loaded = ModelLoaded("/models/m.gguf", "Fake-1M", "llama", 1_000_000, "F32", 2048, "cpu")
    window.header.show_loaded(loaded)
    menu_action(window, "Help", "About").trigger()
    text = open_dialog(qtbot, window, AboutDialog).label.text()
    assert "Model: Fake-1M (" in text and window.header.info.text() in text


def test_about_from_a_source_tree_names_no_version(harness, qtbot, monkeypatch):
    def not_installed(_name):
        raise importlib.metadata.PackageNotFoundError("branchchat")

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    window = harness.open()
    menu_action(window, "Help", "About").trigger()
    assert "branchchat (from source)" in open_dialog(qtbot, window, AboutDialog).label.text()
