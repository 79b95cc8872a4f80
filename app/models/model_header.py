"""The bar above the chat: the loaded model (name, family, size, quantization, context),
its load progress, the model picker and the settings button."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QProgressBar,
    QToolButton,
    QVBoxLayout,
)

from app.conversation.chat_settings import ChatSettings
from engine.events import ModelLoaded, ModelLoading
from engine.stats_format import compact, parameters


def model_info_line(event: ModelLoaded) -> str:
    parts = [event.family]
    if event.num_parameters:
        parts.append(parameters(event.num_parameters))
    if event.quantization:
        parts.append(event.quantization)
    parts.append(f"{compact(event.context_length)} ctx")
    if event.backend:
        parts.append(event.backend)
    if event.draft_model:
        parts.append(f"draft: {Path(event.draft_model).name}")
    return " · ".join(parts)


class ModelHeader(QFrame):
    default_model_requested = Signal()
    open_file_requested = Signal()
    open_folder_requested = Signal()
    model_path_requested = Signal(str)
    settings_requested = Signal()
    chat_settings_requested = Signal()

    def __init__(self, recent_models: Callable[[], tuple[str, ...]], parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("modelHeader")
        self._recent_models = recent_models
        self.name = QLabel("No model loaded", self)
        self.name.setObjectName("modelName")
        self.info = QLabel("Pick one from the Model menu", self)
        self.info.setObjectName("mutedLabel")
        self.progress = QProgressBar(self)
        self.progress.setObjectName("loadBar")
        self.progress.setTextVisible(False)
        self.progress.setFixedSize(140, 6)
        self.progress.hide()
        self.picker = QToolButton(self)
        self.picker.setObjectName("headerButton")
        self.picker.setText("Model ▾")
        self.picker.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.picker.setCursor(Qt.CursorShape.PointingHandCursor)
        self.menu = QMenu(self.picker)
        self.menu.aboutToShow.connect(self._fill_menu)
        self.picker.setMenu(self.menu)
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

    def show_loading(self, event: ModelLoading) -> None:
        if self.name.text() == "No model loaded" or self.progress.isHidden():
            self.name.setText(f"Loading {Path(event.path).name}…")
        self.info.setText(event.stage)
        self.progress.setRange(0, 1000)
        self.progress.setValue(int(1000 * max(0.0, min(1.0, event.fraction))))
        self.progress.show()

    def show_loaded(self, event: ModelLoaded) -> None:
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
        self.progress.hide()
        self.name.setText(title)
        self.info.setText(detail)

    def _fill_menu(self) -> None:
        self.menu.clear()
        # QMenu.addAction takes a callable: a signal's bound emit, not the signal itself
        self.menu.addAction(
            "Default model (SmolLM2-135M-Instruct)", self.default_model_requested.emit
        )
        self.menu.addAction("Open GGUF file…", self.open_file_requested.emit)
        self.menu.addAction("Open model folder…", self.open_folder_requested.emit)
        recent = self._recent_models()
        if recent:
            self.menu.addSeparator()
            self.menu.addSection("Recent")
            for path in recent:
                action = self.menu.addAction(Path(path).name)
                action.setToolTip(path)
                action.triggered.connect(lambda _=False, p=path: self.model_path_requested.emit(p))
