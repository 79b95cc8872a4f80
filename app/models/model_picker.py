"""The model picker: the models branchchat ships, the recent files and folders, and ways to
open or download another, each with its size, family, quantization and context length
(read from the file's header, not its weights), and the progress of the load picked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
)

from app.models.model_entry_delegate import ModelEntryDelegate, PathRole
from app.models.model_info import SHIPPED_MODELS, ModelInfo, read_model_info
from engine.events import ModelLoaded, ModelLoading

SHIPPED_PREFIX = "shipped:"


class ModelPicker(QDialog):
    shipped_requested = Signal(str)  # a ShippedModel key
    model_path_requested = Signal(str)
    open_file_requested = Signal()
    open_folder_requested = Signal()
    download_requested = Signal()

    def __init__(
        self,
        recent_models: Callable[[], tuple[str, ...]],
        loaded_path: Callable[[], str | None] = lambda: None,
        parent=None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("modelPicker")
        self.setWindowTitle("Choose a model")
        self.setMinimumSize(560, 420)
        self._recent_models = recent_models
        self._loaded_path = loaded_path  # the model in use: marked, and selected at first
        self.infos: dict[str, ModelInfo] = {}  # path -> what the list shows of it
        self.list = QListWidget(self)
        self.list.setObjectName("modelList")
        self.list.setItemDelegate(ModelEntryDelegate(self.list))
        self.list.setMouseTracking(True)  # the hover highlight
        self.list.setSpacing(1)
        self.status = QLabel("", self)
        self.status.setObjectName("mutedLabel")
        self.status.setWordWrap(True)
        self.progress = QProgressBar(self)
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.setFixedHeight(6)
        self.progress.hide()
        self.open_file_button = QPushButton("Open file…", self)
        self.open_folder_button = QPushButton("Open folder…", self)
        self.download_button = QPushButton("Download from Hugging Face…", self)
        self.load_button = QPushButton("Load", self)
        self.load_button.setDefault(True)
        self.close_button = QPushButton("Close", self)
        actions = QHBoxLayout()
        for button in (self.open_file_button, self.open_folder_button, self.download_button):
            actions.addWidget(button)
        actions.addStretch(1)
        actions.addWidget(self.load_button)
        actions.addWidget(self.close_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.status)
        layout.addWidget(self.progress)
        layout.addLayout(actions)
        self.open_file_button.clicked.connect(self.open_file_requested)
        self.open_folder_button.clicked.connect(self.open_folder_requested)
        self.download_button.clicked.connect(self.download_requested)
        self.load_button.clicked.connect(self.load_selected)
        self.close_button.clicked.connect(self.reject)
        # Enter reaches the default button (Load) from the list too; a double-click loads
        self.list.itemDoubleClicked.connect(lambda _item: self.load_selected())
        self.list.currentItemChanged.connect(lambda *_: self._update_load_button())
        self.refresh()

    # -- the list ----------------------------------------------------------------------------

    def refresh(self) -> None:
        """Fill the list again (the recent models change with every load)."""
        self.list.clear()
        loaded = self._loaded_path()
        current = -1
        self._heading("Shipped with branchchat")
        for shipped in SHIPPED_MODELS:
            info = shipped.current_info()
            where = (
                "on disk" if shipped.is_present() else f"fetched on first use ({shipped.source})"
            )
            if loaded == str(shipped.path()):
                where, current = "loaded", self.list.count()
            detail = f"{info.summary()} · {where}"
            if shipped.license_name:
                detail += f" · {shipped.license_name}"
            target = f"{SHIPPED_PREFIX}{shipped.key}"
            self._entry(target, info, detail, tooltip=shipped.license_notice)
        recent = [p for p in self._recent_models() if p not in self._shipped_paths()]
        if recent:
            self._heading("Recent")
        for path in recent:
            info = read_model_info(path)
            detail = info.summary()
            if path == loaded:
                detail, current = f"{detail} · loaded", self.list.count()
            self._entry(path, info, detail, enabled=not info.problem, tooltip=path)
        if current < 0:
            current = next((i for i in range(self.list.count()) if self._is_entry(i)), -1)
        self.list.setCurrentRow(current)

    def entry_rows(self) -> list[tuple[str, str]]:
        """(title, detail) of each entry, in order: what a person reads."""
        rows = []
        for i in range(self.list.count()):
            if self._is_entry(i):
                title, _, detail = self.list.item(i).text().partition("\n")
                rows.append((title, detail))
        return rows

    def select(self, title: str) -> None:
        for i in range(self.list.count()):
            if self._is_entry(i) and self.list.item(i).text().partition("\n")[0] == title:
                self.list.setCurrentRow(i)
                return
        raise KeyError(title)

    def load_selected(self) -> None:
        item = self.list.currentItem()
        if item is None or not item.flags() & Qt.ItemFlag.ItemIsEnabled:
            return
        target = item.data(PathRole)
        if not target:
            return
        if target.startswith(SHIPPED_PREFIX):
            self.shipped_requested.emit(target.removeprefix(SHIPPED_PREFIX))
        else:
            self.model_path_requested.emit(target)

    def _shipped_paths(self) -> set[str]:
        return {str(s.path()) for s in SHIPPED_MODELS}

    def _heading(self, text: str) -> None:
        item = QListWidgetItem(text, self.list)
        item.setFlags(Qt.ItemFlag.NoItemFlags)

    def _entry(
        self, target: str, info: ModelInfo, detail: str, *, enabled: bool = True, tooltip: str = ""
    ) -> None:
        item = QListWidgetItem(f"{info.name}\n{detail}", self.list)
        item.setData(PathRole, target)
        item.setToolTip(tooltip or info.path)
        if not enabled:
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled)
        self.infos[target] = info

    def _is_entry(self, row: int) -> bool:
        return bool(self.list.item(row).data(PathRole))

    def _update_load_button(self) -> None:
        item = self.list.currentItem()
        enabled = item is not None and bool(item.flags() & Qt.ItemFlag.ItemIsEnabled)
        self.load_button.setEnabled(enabled and bool(item.data(PathRole)))

    # -- the load in progress ----------------------------------------------------------------

    def show_loading(self, event: ModelLoading) -> None:
        self.status.setText(f"Loading {Path(event.path).name}: {event.stage}")
        self.progress.setValue(int(1000 * max(0.0, min(1.0, event.fraction))))
        self.progress.show()

    def show_message(self, text: str) -> None:
        self.progress.hide()
        self.status.setText(text)

    def show_loaded(self, event: ModelLoaded) -> None:
        """The pick is loaded: the picker has done its job."""
        self.progress.hide()
        self.status.setText("")
        self.accept()
