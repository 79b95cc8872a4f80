"""The settings dialog: system prompt, sampling, max tokens, drafter, memory budget and the
drafted-token tint. It edits an AppSettings; the window saves and applies it."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.settings.app_settings import AppSettings
from app.settings.send_key import SEND_KEY_LABELS, SEND_KEYS
from app.settings.spin_boxes import double_box, int_box
from engine.events import DRAFTER_KINDS, DrafterKind
from engine.memory import default_budget_bytes

DRAFTER_LABELS: dict[str, str] = {
    DrafterKind.AUTO: "Auto (picks what pays)",
    DrafterKind.OFF: "Off",
    DrafterKind.LOOKUP: "Prompt lookup",
    DrafterKind.DRAFT_MODEL: "Draft model",
    DrafterKind.BLOCK: "Block drafter + prompt lookup",
}


class SettingsDialog(QDialog):
    def __init__(self, settings: AppSettings, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setMinimumWidth(460)
        self._settings = settings
        self.system_prompt = QPlainTextEdit(settings.system_prompt, self)
        self.system_prompt.setPlaceholderText("Optional: how the assistant should behave")
        self.system_prompt.setFixedHeight(90)
        self.temperature = double_box(0.0, 2.0, 0.05, settings.temperature)
        self.top_p = double_box(0.01, 1.0, 0.01, settings.top_p)
        self.top_k = int_box(0, 1000, settings.top_k, "off")
        self.max_tokens = int_box(1, 32768, settings.max_tokens)
        self.drafter = QComboBox(self)
        for kind in DRAFTER_KINDS:
            self.drafter.addItem(DRAFTER_LABELS[kind], kind)
        self.drafter.setCurrentIndex(DRAFTER_KINDS.index(settings.drafter))
        self.draft_model_path = QLineEdit(settings.draft_model_path, self)
        self.draft_model_path.setPlaceholderText("A smaller model sharing the tokenizer")
        browse = QPushButton("Browse…", self)
        browse.clicked.connect(self._browse)
        draft_row = QWidget(self)
        row = QHBoxLayout(draft_row)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.draft_model_path, 1)
        row.addWidget(browse)
        self._draft_row = draft_row
        self.memory_budget = int_box(0, 1 << 24, settings.memory_budget_mb)
        self.memory_budget.setSuffix(" MB")
        self.memory_budget.setSingleStep(256)
        automatic = default_budget_bytes() >> 20
        self.memory_budget.setSpecialValueText(f"Automatic ({automatic:,} MB)")
        self.memory_budget.setToolTip(
            "Memory for the conversation's computed state: the live state, rollback "
            "snapshots, cached sibling branches and the drafter's index. Past it, sibling "
            "branches go first, then the oldest snapshots, then the index; the state being "
            "answered always stays. Automatic: a quarter of this machine's memory."
        )
        self.tint_drafted = QCheckBox("Tint tokens that came from accepted drafts", self)
        self.tint_drafted.setChecked(settings.tint_drafted)
        self.send_key = QComboBox(self)
        for key in SEND_KEYS:
            self.send_key.addItem(SEND_KEY_LABELS[key], key)
        self.send_key.setCurrentIndex(SEND_KEYS.index(settings.send_key))
        form = QFormLayout()
        form.addRow("System prompt", self.system_prompt)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("Drafter", self.drafter)
        form.addRow("Draft model", draft_row)
        form.addRow("Memory budget", self.memory_budget)
        form.addRow("", self.tint_drafted)
        form.addRow("Send with", self.send_key)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(buttons)
        self.drafter.currentIndexChanged.connect(self._update_draft_row)
        self._update_draft_row()

    def _update_draft_row(self) -> None:
        self._draft_row.setEnabled(self.drafter.currentData() == DrafterKind.DRAFT_MODEL)

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Draft model", "", "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.draft_model_path.setText(path)

    def result_settings(self) -> AppSettings:
        return replace(
            self._settings,
            system_prompt=self.system_prompt.toPlainText(),
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            top_k=self.top_k.value(),
            max_tokens=self.max_tokens.value(),
            drafter=self.drafter.currentData(),
            draft_model_path=self.draft_model_path.text().strip(),
            memory_budget_mb=self.memory_budget.value(),
            tint_drafted=self.tint_drafted.isChecked(),
            send_key=self.send_key.currentData(),
        )
