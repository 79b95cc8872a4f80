"""The in-place editor a message bubble turns into: the text, [Cancel] and the save
button. Esc cancels; the key that sends from the message box saves (Enter, or Ctrl+Enter
where Settings says so: the window hands its test in), Ctrl+Enter always; the other
Enter makes a new line. All are taken before any window shortcut."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout

SAVE_LABELS = {"user": "Save && regenerate", "assistant": "Save as new branch"}
ENTER_KEYS = (Qt.Key.Key_Return, Qt.Key.Key_Enter)


def ctrl_enter(event: QKeyEvent) -> bool:
    return event.key() in ENTER_KEYS and bool(
        event.modifiers() & Qt.KeyboardModifier.ControlModifier
    )


class MessageEditor(QFrame):
    saved = Signal(str)
    cancelled = Signal()

    def __init__(
        self, role: str, text: str, parent=None, is_save: Callable[[QKeyEvent], bool] = ctrl_enter
    ) -> None:
        super().__init__(parent)
        self.is_save = is_save
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
            is_save = self.is_save(event)
            if is_escape or is_save:
                event.accept()  # a ShortcutOverride accepted here keeps window shortcuts off
                if event.type() == QEvent.Type.KeyPress:
                    self.cancelled.emit() if is_escape else self._save()
                return True
            if event.type() == QEvent.Type.KeyPress and event.key() in ENTER_KEYS:
                # a plain new line, never the separator QPlainTextEdit puts for Shift+Enter
                self.text_edit.textCursor().insertText("\n")
                self.text_edit.ensureCursorVisible()
                return True
        return super().eventFilter(watched, event)
