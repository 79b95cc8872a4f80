"""The Help menu's windows. Keyboard shortcuts lists what the window's own actions,
shortcuts and buttons are bound to, read from them when it opens, so the list cannot drift
from what the keys do; the composer's keys follow the send key Settings chose. About names
the version, the loaded model and where the chats are kept."""

from __future__ import annotations

import html
import importlib.metadata
import platform
from typing import TYPE_CHECKING

from PySide6 import __version__ as pyside_version
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractButton,
    QDialog,
    QDialogButtonBox,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.settings.send_key import SendKey

if TYPE_CHECKING:
    from app.window.main_window import MainWindow

COMPOSER_KEYS = {  # a message being edited saves with the key that sends
    SendKey.ENTER: (
        ("Send the message", "Enter"),
        ("New line", "Shift+Enter"),
        ("Save an edited message", "Enter"),
    ),
    SendKey.CTRL_ENTER: (
        ("Send the message", "Ctrl+Enter"),
        ("New line", "Enter"),
        ("Save an edited message", "Ctrl+Enter"),
    ),
}
EDIT_LAST = ("Edit your last message (empty box)", "Up")
CANCEL_EDIT = ("Cancel an edit", "Esc")


def _keys(sequence: QKeySequence) -> str:
    return sequence.toString(QKeySequence.SequenceFormat.NativeText)


def window_shortcuts(window: MainWindow) -> list[tuple[str, str]]:
    """(what it does, its keys) for every bound key of the window, in the menus' order
    first, then the window's own shortcuts, the buttons' and the composer's."""
    rows: list[tuple[str, str]] = []
    for menu_action in window.menuBar().actions():
        for action in menu_action.menu().actions():
            if not action.shortcut().isEmpty():
                rows.append((action.text().replace("&", "").rstrip("…"), _keys(action.shortcut())))
    for shortcut in window.findChildren(QShortcut):
        if shortcut.whatsThis():
            rows.append((shortcut.whatsThis(), _keys(shortcut.key())))
    for button in window.findChildren(QAbstractButton):
        if not button.shortcut().isEmpty():
            rows.append((button.toolTip().split(" (")[0], _keys(button.shortcut())))
    rows += COMPOSER_KEYS[window.composer.edit.send_key]
    rows += [EDIT_LAST, CANCEL_EDIT]
    return rows


class ShortcutsDialog(QDialog):
    def __init__(self, rows: list[tuple[str, str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.table = QTableWidget(len(rows), 2, self)
        self.table.setHorizontalHeaderLabels(["Action", "Keys"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        for row, (label, keys) in enumerate(rows):
            self.table.setItem(row, 0, QTableWidgetItem(label))
            self.table.setItem(row, 1, QTableWidgetItem(keys))
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setStretchLastSection(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(buttons)
        whole = self.table.verticalHeader().length() + self.table.horizontalHeader().height()
        self.table.setMinimumHeight(min(whole + 2 * self.table.frameWidth(), 640))  # no scroll
        self.resize(460, self.sizeHint().height())

    def rows(self) -> list[tuple[str, str]]:
        return [
            (self.table.item(r, 0).text(), self.table.item(r, 1).text())
            for r in range(self.table.rowCount())
        ]


def about_text(window: MainWindow) -> str:
    try:
        version = importlib.metadata.version("branchchat")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        version = "(from source)"
    model = window.header.name.text() if window.header.loaded_path else "none loaded"
    detail = window.header.info.text() if window.header.loaded_path else ""
    return (
        f"<h3>branchchat {version}</h3>"
        "<p>Local chats you can edit and branch at any message, with exact rollback and "
        "lossless speculative decoding.</p>"
        f"<p>Model: {html.escape(model)}"
        + (f" ({html.escape(detail)})" if detail else "")
        + f"<br>Chats are kept in: {html.escape(str(window.store.path))}</p>"
        f"<p>Python {platform.python_version()} · Qt for Python {pyside_version}</p>"
    )


class AboutDialog(QDialog):
    def __init__(self, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About branchchat")
        self.label = QLabel(text, self)
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.label)
        layout.addWidget(buttons)
        self.resize(480, 200)


def open_shortcuts(window: MainWindow) -> ShortcutsDialog:
    dialog = ShortcutsDialog(window_shortcuts(window), window)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.open()
    return dialog


def open_about(window: MainWindow) -> AboutDialog:
    dialog = AboutDialog(about_text(window), window)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.open()
    return dialog
