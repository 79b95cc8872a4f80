"""The bar above the chat: the loaded model (name, family, size, quantization, context),
its load progress, the button that opens the model picker (Ctrl+L), the chat's settings
and the app's settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QToolButton,
    QVBoxLayout,
)

from app.conversation.chat_settings import ChatSettings
from app.models.model_info import DEFAULT_MODEL_KEY
from app.models.model_picker import ModelPicker
from engine.events import ModelLoaded, ModelLoading
from engine.stats_format import compact, parameters


class ElidedLabel(QLabel):
    """A one-line label that ends in "…" where its room is short (a long model name in a
    narrow window), the whole text in its tooltip; `text()` is the whole text."""

    def __init__(self, text: str, parent=None) -> None:
        super().__init__(parent)
        self._whole = ""
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        self._whole = text
        self.updateGeometry()
        self._elide()

    def text(self) -> str:
        return self._whole

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        hint = super().sizeHint()
        return QSize(self.fontMetrics().horizontalAdvance(self._whole) + 2, hint.height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(self.fontMetrics().horizontalAdvance("M…"), super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        shown = self.fontMetrics().elidedText(
            self._whole, Qt.TextElideMode.ElideRight, self.width()
        )
        QLabel.setText(self, shown)
        self.setToolTip(self._whole if shown != self._whole else "")


def model_info_line(event: ModelLoaded) -> str:
    parts = [event.family]
    if event.num_parameters:
        parts.append(parameters(event.num_parameters))
    if event.quantization:
        parts.append(event.quantization)
    if event.context_length:  # a remote server may not say
        parts.append(f"{compact(event.context_length)} ctx")
    if event.backend:
        parts.append(event.backend)
    if event.draft_model:
        parts.append(f"draft: {Path(event.draft_model).name}")
    return " · ".join(parts)


class ModelHeader(QFrame):
    default_model_requested = Signal()
    shipped_model_requested = Signal(str)  # another shipped model's name (gemma3-270m)
    open_file_requested = Signal()
    open_folder_requested = Signal()
    model_path_requested = Signal(str)
    download_requested = Signal()  # "Download from Hugging Face…" in the picker
    settings_requested = Signal()
    chat_settings_requested = Signal()

    def __init__(self, recent_models: Callable[[], tuple[str, ...]], parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("modelHeader")
        self._recent_models = recent_models
        self.name = ElidedLabel("No model loaded", self)
        self.name.setObjectName("modelName")
        self.info = ElidedLabel("Pick one with the Model button (Ctrl+L)", self)
        self.info.setObjectName("mutedLabel")
        self.progress = QProgressBar(self)
        self.progress.setObjectName("loadBar")
        self.progress.setTextVisible(False)
        self.progress.setFixedSize(140, 6)
        self.progress.hide()
        self.picker = QToolButton(self)
        self.picker.setObjectName("headerButton")
        self.picker.setText("Model ▾")
        self.picker.setToolTip("Choose a model (Ctrl+L)")
        self.picker.setShortcut(QKeySequence("Ctrl+L"))
        self.picker.setCursor(Qt.CursorShape.PointingHandCursor)
        self.picker.clicked.connect(self.open_picker)
        self.picker_dialog: ModelPicker | None = None  # while open
        self.loaded_path: str | None = None  # the model the engine has loaded
        self.chat_button = QToolButton(self)
        self.chat_button.setObjectName("headerButton")
        self.chat_button.setText("Chat settings")
        self.chat_button.setToolTip("This chat's system prompt, preset, sampling and thinking")
        self.chat_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.chat_button.clicked.connect(self.chat_settings_requested)
        self.settings_button = QToolButton(self)
        self.settings_button.setObjectName("headerButton")
        self.settings_button.setText("⚙")
        self.settings_button.setToolTip("Settings")
        self.settings_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.settings_button.clicked.connect(self.settings_requested)
        text = QVBoxLayout()
        text.setSpacing(0)
        text.addWidget(self.name)
        text.addWidget(self.info)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(20, 8, 14, 8)
        layout.addLayout(text, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.picker)
        layout.addWidget(self.chat_button)
        layout.addWidget(self.settings_button)

    def open_picker(self) -> ModelPicker:
        """Show the picker (a second click brings the open one forward)."""
        if self.picker_dialog is None:
            picker = ModelPicker(self._recent_models, lambda: self.loaded_path, self.window())
            picker.shipped_requested.connect(self._on_shipped)
            picker.model_path_requested.connect(self.model_path_requested)
            picker.open_file_requested.connect(self.open_file_requested)
            picker.open_folder_requested.connect(self.open_folder_requested)
            picker.download_requested.connect(self.download_requested)
            picker.finished.connect(self._on_picker_closed)
            self.picker_dialog = picker
        self.picker_dialog.refresh()
        self.picker_dialog.show()
        self.picker_dialog.raise_()
        self.picker_dialog.activateWindow()
        return self.picker_dialog

    def _on_picker_closed(self, _result: int) -> None:
        picker, self.picker_dialog = self.picker_dialog, None
        if picker is not None:
            picker.deleteLater()

    def _on_shipped(self, key: str) -> None:
        if key == DEFAULT_MODEL_KEY:
            self.default_model_requested.emit()
        else:
            self.shipped_model_requested.emit(key)

    def show_loading(self, event: ModelLoading) -> None:
        if self.picker_dialog is not None:
            self.picker_dialog.show_loading(event)
        if self.name.text() == "No model loaded" or self.progress.isHidden():
            self.name.setText(f"Loading {Path(event.path).name}…")
        self.info.setText(event.stage)
        self.progress.setRange(0, 1000)
        self.progress.setValue(int(1000 * max(0.0, min(1.0, event.fraction))))
        self.progress.show()

    def show_loaded(self, event: ModelLoaded) -> None:
        self.loaded_path = event.path
        if self.picker_dialog is not None:
            self.picker_dialog.show_loaded(event)
        self.progress.hide()
        self.name.setText(event.name)
        self.info.setText(model_info_line(event))
        self.setToolTip(event.path)

    def show_chat_settings(self, settings: ChatSettings) -> None:
        """The chat button names what the chat on screen uses: its preset, thinking off."""
        label = settings.preset or "Custom"
        if settings.system_prompt.strip():
            label += " · system prompt"
        if not settings.thinking:
            label += " · no thinking"
        self.chat_button.setText(f"Chat: {label}")

    def show_message(self, title: str, detail: str = "") -> None:
        if self.picker_dialog is not None:
            self.picker_dialog.show_message(f"{title}: {detail}" if detail else title)
        self.progress.hide()
        self.name.setText(title)
        self.info.setText(detail)
