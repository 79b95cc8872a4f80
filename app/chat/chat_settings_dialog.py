"""The chat settings dialog: one chat's system prompt, preset, sampling, limits and thinking
switch. It edits a ChatSettings; app.chat.chat_settings_editor saves it with the chat."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.conversation.chat_settings import ChatSettings, Preset, PresetLibrary
from app.settings.spin_boxes import double_box, int_box

CUSTOM = "Custom"  # the preset box's entry while the sampling matches no preset
MAX_CONTEXT = 1 << 20


class ChatSettingsDialog(QDialog):
    def __init__(
        self,
        settings: ChatSettings,
        presets: PresetLibrary,
        model_context: int | None = None,
        title: str = "",
        parent=None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Chat settings — {title}" if title else "Chat settings")
        self.setMinimumWidth(480)
        self._settings, self.presets = settings, presets
        self._filling = False  # a preset is filling the boxes: no switch to "Custom"
        self.preset = QComboBox(self)
        self.preset.setObjectName("presetBox")
        self.save_preset = QPushButton("Save as preset…", self)
        self.delete_preset = QPushButton("Delete", self)
        self.system_prompt = QPlainTextEdit(settings.system_prompt, self)
        self.system_prompt.setPlaceholderText("Optional: how the assistant should behave here")
        self.system_prompt.setFixedHeight(90)
        self.temperature = double_box(0.0, 2.0, 0.05, settings.temperature)
        self.temperature.setToolTip("0 is greedy: the most likely token each time")
        self.top_p = double_box(0.01, 1.0, 0.01, settings.top_p)
        self.top_k = int_box(0, 1000, settings.top_k, "off")
        self.min_p = double_box(0.0, 0.99, 0.01, settings.min_p)
        self.repetition_penalty = double_box(0.5, 2.0, 0.01, settings.repetition_penalty)
        self.seed = int_box(-1, 2**31 - 1, -1 if settings.seed is None else settings.seed, "random")
        self.seed.setToolTip("The same seed and settings give the same reply")
        self.max_tokens = int_box(1, 131072, settings.max_tokens)
        model_text = f"model's ({model_context:,})" if model_context else "model's"
        self.context_length = int_box(0, MAX_CONTEXT, settings.context_length or 0, model_text)
        self.context_length.setSuffix(" tokens")
        self.context_length.setToolTip("At most the model's context; less keeps memory down")
        self.thinking = QCheckBox("Let reasoning models think first (enable_thinking)", self)
        self.thinking.setChecked(settings.thinking)
        self.error = QLabel("", self)
        self.error.setObjectName("errorLabel")
        self.error.setWordWrap(True)
        self.error.hide()

        preset_row = QWidget(self)
        row = QHBoxLayout(preset_row)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.preset, 1)
        row.addWidget(self.save_preset)
        row.addWidget(self.delete_preset)
        form = QFormLayout()
        form.addRow("Preset", preset_row)
        form.addRow("System prompt", self.system_prompt)
        for label, box in (
            ("Temperature", self.temperature),
            ("Top-p", self.top_p),
            ("Top-k", self.top_k),
            ("Min-p", self.min_p),
            ("Repetition penalty", self.repetition_penalty),
            ("Seed", self.seed),
            ("Max tokens", self.max_tokens),
            ("Context length", self.context_length),
        ):
            form.addRow(label, box)  # fmt: skip
        form.addRow("", self.thinking)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self
        )
        self.buttons.accepted.connect(self._accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(self.buttons)

        self._fill_presets(settings.preset if self._matching(settings) else CUSTOM)
        self.preset.activated.connect(self._on_preset_picked)
        for box in self._preset_boxes():
            box.valueChanged.connect(self._on_sampling_edited)
        self.save_preset.clicked.connect(self._save_preset)
        self.delete_preset.clicked.connect(self._delete_preset)

    # -- what the dialog holds ------------------------------------------------------------

    def result_settings(self) -> ChatSettings:
        """The settings as the boxes say (ValueError when they do not make sense)."""
        seed, context = self.seed.value(), self.context_length.value()
        name = self.preset.currentText()
        return replace(
            self._settings,
            system_prompt=self.system_prompt.toPlainText(),
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            top_k=self.top_k.value(),
            min_p=self.min_p.value(),
            repetition_penalty=self.repetition_penalty.value(),
            seed=None if seed < 0 else seed,
            max_tokens=self.max_tokens.value(),
            context_length=context or None,
            thinking=self.thinking.isChecked(),
            preset="" if name == CUSTOM else name,
        )

    def _accept(self) -> None:
        try:
            self.result_settings()
        except ValueError as error:  # the boxes stay as typed, to be corrected
            self.error.setText(str(error))
            self.error.show()
            return
        self.accept()

    # -- presets --------------------------------------------------------------------------

    def _preset_boxes(self) -> tuple:
        return (self.temperature, self.top_p, self.top_k, self.min_p, self.repetition_penalty,
                self.max_tokens)  # fmt: skip

    def _matching(self, settings: ChatSettings) -> bool:
        preset = self.presets.get(settings.preset)
        return preset is not None and settings.matches(preset)

    def _fill_presets(self, current: str) -> None:
        self.preset.clear()
        for preset in self.presets.presets():
            self.preset.addItem(preset.name)
        self.preset.addItem(CUSTOM)
        self.preset.setCurrentText(current if self.presets.get(current) else CUSTOM)
        self._update_delete()

    def _update_delete(self) -> None:
        preset = self.presets.get(self.preset.currentText())
        self.delete_preset.setEnabled(preset is not None and not preset.is_builtin)

    def _on_preset_picked(self, _index: int) -> None:
        preset = self.presets.get(self.preset.currentText())
        if preset is not None:
            self._filling = True
            for name, value in preset.values.items():
                getattr(self, name).setValue(value)
            self._filling = False
        self._update_delete()

    def _on_sampling_edited(self, _value: object) -> None:
        if not self._filling and self.preset.currentText() != CUSTOM:
            self.preset.setCurrentText(CUSTOM)
            self._update_delete()

    def _save_preset(self) -> None:
        name, ok = QInputDialog.getText(self, "Save preset", "Name of the preset:")
        if not ok or not name.strip():
            return
        try:
            self.presets.save(Preset.of(name, self.result_settings()))
        except (ValueError, OSError) as error:
            QMessageBox.warning(self, "Save preset", f"Could not save the preset: {error}")
            return
        self._fill_presets(name.strip())

    def _delete_preset(self) -> None:
        name = self.preset.currentText()
        try:
            self.presets.delete(name)
        except (ValueError, OSError) as error:
            QMessageBox.warning(self, "Delete preset", f"Could not delete the preset: {error}")
            return
        self._fill_presets(CUSTOM)
