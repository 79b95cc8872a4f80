"""The composer's message box: grows with its text up to MAX_LINES; Enter sends and
Shift+Enter makes a new line (or Ctrl+Enter sends, as Settings choose); Up in an empty
box edits the last message."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit

from app.settings.send_key import SendKey

MAX_LINES = 8
PLACEHOLDERS = {
    SendKey.ENTER: "Message…  (Enter to send, Shift+Enter for a new line)",
    SendKey.CTRL_ENTER: "Message…  (Ctrl+Enter to send, Enter for a new line)",
}
# a model without a chat template (a base model) continues the text it is sent
PLAIN_COMPLETION = "This model has no chat template: plain text completion. Start a text"


class ComposerEdit(QPlainTextEdit):
    send_requested = Signal()
    edit_last_requested = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("composerEdit")
        self.setTabChangesFocus(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.document().contentsChanged.connect(self.updateGeometry)
        self.send_key = SendKey.ENTER
        self.is_plain_completion = False
        self.set_send_key(SendKey.ENTER)

    def set_send_key(self, key: str) -> None:
        self.send_key = SendKey(key)
        self._show_placeholder()

    def set_plain_completion(self, on: bool) -> None:
        """Say that the text sent is continued as it is (the model has no chat template)."""
        self.is_plain_completion = on
        self._show_placeholder()

    def _show_placeholder(self) -> None:
        text = PLACEHOLDERS[self.send_key]
        if self.is_plain_completion:
            text = f"{PLAIN_COMPLETION} for it to continue…{text.removeprefix('Message…')}"
        self.setPlaceholderText(text)
        # Qt repaints the placeholder only when it appears or goes, not when its text
        # changes: a model switch or a new send key left the old text on screen
        self.viewport().update()

    def is_send(self, event: QKeyEvent) -> bool:
        if event.key() not in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            return False
        modifiers = event.modifiers()
        if modifiers & Qt.KeyboardModifier.ControlModifier:
            return True  # Ctrl+Enter sends in either mode
        plain = not modifiers & (
            Qt.KeyboardModifier.ShiftModifier | Qt.KeyboardModifier.AltModifier
        )
        return self.send_key == SendKey.ENTER and plain

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if self.is_send(event):
            self.send_requested.emit()
            return
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            # Shift+Enter (or Enter in Ctrl+Enter mode): a plain new line, never the
            # paragraph separator QPlainTextEdit inserts for Shift+Enter
            self.textCursor().insertText("\n")
            self.ensureCursorVisible()
            return
        if event.key() == Qt.Key.Key_Up and not self.toPlainText():
            self.edit_last_requested.emit()
            return
        super().keyPressEvent(event)

    def sizeHint(self) -> QSize:
        line = self.fontMetrics().lineSpacing()
        lines = min(MAX_LINES, max(1, int(self.document().size().height())))
        margins = self.contentsMargins()
        extra = int(2 * self.document().documentMargin()) + margins.top() + margins.bottom()
        return QSize(super().sizeHint().width(), lines * line + extra + 4)

    def minimumSizeHint(self) -> QSize:
        return self.sizeHint()
