"""The composer's message box: grows with its text up to MAX_LINES, Ctrl+Enter sends and
Up in an empty box edits the last message."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit

MAX_LINES = 8


class ComposerEdit(QPlainTextEdit):
    send_requested = Signal()
    edit_last_requested = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("composerEdit")
        self.setPlaceholderText("Message…  (Ctrl+Enter to send)")
        self.setTabChangesFocus(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.document().contentsChanged.connect(self.updateGeometry)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        is_enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if is_enter and event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self.send_requested.emit()
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
