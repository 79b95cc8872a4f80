"""The in-place editor a message bubble turns into: the text, [Cancel] and the save
button. Esc cancels and Ctrl+Enter saves; both are taken before any window shortcut."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout

SAVE_LABELS = {"user": "Save && regenerate", "assistant": "Save as new branch"}


class MessageEditor(QFrame):
    saved = Signal(str)
    cancelled = Signal()

    def __init__(self, role: str, text: str, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("messageEditor")
        self.setAutoFillBackground(True)
        self.text_edit = QPlainTextEdit(self)
        self.text_edit.setObjectName("messageEditorText")
        self.text_edit.setPlainText(text)
        self.text_edit.installEventFilter(self)
        self.cancel_button = QPushButton("Cancel", self)
        self.save_button = QPushButton(SAVE_LABELS.get(role, "Save"), self)
        self.save_button.setObjectName("primaryButton")
        self.save_button.setDefault(True)
        self.cancel_button.clicked.connect(self.cancelled)
        self.save_button.clicked.connect(self._save)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.save_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 10, 10, 10)
        layout.setSpacing(8)
        layout.addWidget(self.text_edit, 1)
        layout.addLayout(buttons)
        self.setFocusProxy(self.text_edit)

    @property
    def text(self) -> str:
        return self.text_edit.toPlainText()

    def focus_end(self) -> None:
        self.text_edit.setFocus()
        self.text_edit.moveCursor(self.text_edit.textCursor().MoveOperation.End)

    def _save(self) -> None:
        self.saved.emit(self.text)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.text_edit and event.type() in (
            QEvent.Type.ShortcutOverride,
            QEvent.Type.KeyPress,
        ):
            assert isinstance(event, QKeyEvent)
            is_escape = event.key() == Qt.Key.Key_Escape
            is_save = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and bool(
                event.modifiers() & Qt.KeyboardModifier.ControlModifier
            )
            if is_escape or is_save:
                event.accept()  # a ShortcutOverride accepted here keeps window shortcuts off
                if event.type() == QEvent.Type.KeyPress:
                    self.cancelled.emit() if is_escape else self._save()
                return True
        return super().eventFilter(watched, event)
