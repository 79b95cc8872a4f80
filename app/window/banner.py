"""A dismissable banner across the top of the chat: errors (with [Details] when there are
any) and notices with one action, such as [Undo] after a delete.

A message may name its topic (the model, the last request, a send refused): when that
problem is fixed (a model loads, a reply finishes), `resolve(topic)` takes the banner
down, so it never tells of a problem that is gone. A banner about another topic stays."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget


class Banner(QWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.box = QFrame(self)  # the coloured, rounded part; the margins stay outside it
        self.box.setObjectName("banner")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(20, 10, 20, 0)
        outer.addWidget(self.box)
        self.message = QLabel(self)
        self.message.setObjectName("bannerText")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details = QLabel(self)
        self.details.setObjectName("bannerDetails")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_button = QPushButton("Details", self)
        self.action_button = QPushButton(self)
        self.dismiss_button = QPushButton("Dismiss", self)
        for button in (self.details_button, self.action_button, self.dismiss_button):
            button.setObjectName("bannerButton")
            button.setCursor(Qt.CursorShape.PointingHandCursor)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.message, 1)
        row.addWidget(self.action_button)
        row.addWidget(self.details_button)
        row.addWidget(self.dismiss_button)
        layout = QVBoxLayout(self.box)
        layout.setContentsMargins(14, 8, 10, 8)
        layout.addLayout(row)
        layout.addWidget(self.details)
        self._action: Callable[[], None] | None = None
        self.topic = ""  # what the banner shown is about; "" for no topic
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self.dismiss)
        self.details_button.clicked.connect(self._toggle_details)
        self.action_button.clicked.connect(self._run_action)
        self.dismiss_button.clicked.connect(self.dismiss)
        self.hide()

    def show_error(self, message: str, details: str = "", topic: str = "") -> None:
        self._show("error", message, details, None, None, 0, topic)

    def show_notice(
        self,
        message: str,
        action: tuple[str, Callable[[], None]] | None = None,
        timeout_ms: int = 8000,
        topic: str = "",
    ) -> None:
        self._show("info", message, "", *(action or (None, None)), timeout_ms, topic)

    def resolve(self, topic: str) -> None:
        """The problem `topic` names is fixed: a banner about it goes."""
        if topic and self.topic == topic and not self.isHidden():
            self.dismiss()

    def _show(self, kind, message, details, action_text, action, timeout_ms, topic) -> None:
        self.topic = topic
        self.box.setProperty("kind", kind)
        for widget in (self.box, self.message, self.details):
            widget.style().unpolish(widget)
            widget.style().polish(widget)
        self.message.setText(message)
        self.details.setText(details)
        self.details.hide()
        self.details_button.setText("Details")
        self.details_button.setVisible(bool(details))
        self._action = action
        self.action_button.setText(action_text or "")
        self.action_button.setVisible(action is not None)
        self._timer.stop()
        if timeout_ms:
            self._timer.start(timeout_ms)
        self.show()

    def dismiss(self) -> None:
        self._timer.stop()
        self._action = None
        self.topic = ""
        self.hide()

    def _toggle_details(self) -> None:
        visible = not self.details.isVisible()
        self.details.setVisible(visible)
        self.details_button.setText("Hide details" if visible else "Details")

    def _run_action(self) -> None:
        action = self._action
        self.dismiss()
        if action is not None:
            action()
