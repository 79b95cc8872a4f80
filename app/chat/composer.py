"""The composer: prefill progress, the message box with [Send] (which becomes [Stop]
while a reply streams), and the live speed line under it."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.composer_edit import ComposerEdit
from engine.events import ModelLoaded

MIN_PREFILL_FOR_BAR = 256  # tokens: shorter prompts are done before a bar could help


class Composer(QFrame):
    send_requested = Signal(str)
    stop_requested = Signal()
    edit_last_requested = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("composer")
        self._is_generating = False
        self.progress = QProgressBar(self)
        self.progress.setObjectName("prefillBar")
        self.progress.setTextVisible(False)
        self.progress.setFixedHeight(6)
        self.progress_label = QLabel(self)
        self.progress_label.setObjectName("mutedLabel")
        progress_row = QWidget(self)
        row = QHBoxLayout(progress_row)
        row.setContentsMargins(4, 0, 4, 0)
        row.addWidget(self.progress, 1)
        row.addWidget(self.progress_label)
        self._progress_row = progress_row
        progress_row.hide()

        self.edit = ComposerEdit(self)
        self.send_button = QPushButton("Send", self)
        self.send_button.setObjectName("sendButton")
        self.send_button.setCursor(Qt.CursorShape.PointingHandCursor)
        box = QFrame(self)
        box.setObjectName("composerBox")
        box_layout = QHBoxLayout(box)
        box_layout.setContentsMargins(12, 8, 8, 8)
        box_layout.addWidget(self.edit, 1)
        box_layout.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)

        self.status = QLabel(self)
        self.status.setObjectName("statusLine")
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.status.setWordWrap(True)  # a narrow window shows the figures on two lines

        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 6, 24, 10)
        layout.setSpacing(6)
        layout.addWidget(progress_row)
        layout.addWidget(box)
        layout.addWidget(self.status)

        self.edit.send_requested.connect(self._send)
        self.edit.edit_last_requested.connect(self.edit_last_requested)
        self.send_button.clicked.connect(self._on_button)

    @property
    def is_generating(self) -> bool:
        return self._is_generating

    def set_generating(self, on: bool) -> None:
        self._is_generating = on
        self.send_button.setText("Stop" if on else "Send")
        self.send_button.setProperty("stop", on)
        self.send_button.style().unpolish(self.send_button)
        self.send_button.style().polish(self.send_button)

    def set_prefill(self, done: int, total: int, reused: int) -> None:
        """A bar while a long prompt is computed; hidden when done (or total is 0)."""
        if total < MIN_PREFILL_FOR_BAR or done >= total:
            self._progress_row.hide()
            return
        self.progress.setRange(0, total)
        self.progress.setValue(done)
        reused_text = f" (reused {reused:,})" if reused else ""
        self.progress_label.setText(f"prefill {done:,}/{total:,} tokens{reused_text}")
        self._progress_row.show()

    def set_send_key(self, key: str) -> None:
        self.edit.set_send_key(key)

    def show_model(self, event: ModelLoaded) -> None:
        """A model without a chat template continues text: the box says so."""
        self.edit.set_plain_completion(not event.has_chat_template)

    def set_status(self, text: str) -> None:
        self.status.setText(text)

    def _on_button(self) -> None:
        if self._is_generating:
            self.stop_requested.emit()
        else:
            self._send()

    def _send(self) -> None:
        """Enter (or the button) with text: the window decides whether it can go now,
        and says why not (a reply still streaming, no model) instead of dropping it."""
        text = self.edit.toPlainText()
        if text.strip():
            self.send_requested.emit(text)

    def clear(self) -> None:
        self.edit.clear()
