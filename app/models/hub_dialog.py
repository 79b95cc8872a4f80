"""The "Download from Hugging Face" dialog: paste a repo id or a file's URL, pick a file
(quantization, size) from the repo's list, download it into the models folder with
progress, and hand the checked file to whoever loads it. The hub's side is
app.models.hub_download; the listing and the transfer run on worker threads and come
back as queued signals.

Others open it with `show_hub_download(parent, on_downloaded)`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.models.hub_download import (
    DownloadCancelled,
    HubChoice,
    HubClient,
    HubError,
    HubSource,
    choices_for,
    destination,
    parse_source,
    size_text,
)
from engine.default_model import models_dir

PROGRESS_INTERVAL_MS = 100  # the bar moves ~10 times a second, not once a network read
EXAMPLE = "e.g. bartowski/Qwen2.5-0.5B-Instruct-GGUF, or a .gguf file's URL"


class HubWorker(QObject):
    """The hub's calls off the GUI thread; each outcome comes back as a signal."""

    listed = Signal(object, object)  # HubSource, list[HubChoice]
    list_failed = Signal(str)
    downloaded = Signal(str)
    download_failed = Signal(str)
    cancelled = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        # (bytes done, bytes in all) of the download under way, written by its thread
        # and read by the dialog's timer (one tuple, swapped whole)
        self.latest: tuple[int, int] = (0, 0)

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def list_files(self, source: HubSource) -> None:
        self._start(self._list, source)

    def download(self, source: HubSource, choice: HubChoice, folder: Path) -> None:
        self._cancel.clear()
        self._start(self._download, source, choice, folder)

    def cancel(self) -> None:
        self._cancel.set()

    def _start(self, target, *args) -> None:
        self._thread = threading.Thread(target=target, args=args, name="hub", daemon=True)
        self._thread.start()

    def _list(self, source: HubSource) -> None:
        try:
            choices = choices_for(HubClient().list_files(source))
        except HubError as error:
            self.list_failed.emit(str(error))
        else:
            self.listed.emit(source, choices)

    def _download(self, source: HubSource, choice: HubChoice, folder: Path) -> None:
        def progress(done: int, total: int) -> None:
            self.latest = (done, total)

        self.latest = (0, choice.size)
        try:
            path = HubClient().download(source, choice, folder, progress, self._cancel)
        except DownloadCancelled:
            self.cancelled.emit()
        except (HubError, OSError) as error:
            self.download_failed.emit(str(error))
        else:
            self.downloaded.emit(str(path))


class HubDownloadDialog(QDialog):
    downloaded = Signal(str)  # the checked file (or model folder), ready to load

    def __init__(self, parent=None, folder: Path | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Download from Hugging Face")
        self.setMinimumSize(620, 420)
        self.folder = folder if folder is not None else models_dir()
        self.worker = HubWorker(self)
        self._source: HubSource | None = None
        self._choices: list[HubChoice] = []
        self._busy = False  # a listing or a download is under way

        self.source = QLineEdit(self)
        self.source.setPlaceholderText(EXAMPLE)
        self.source.setClearButtonEnabled(True)
        self.find_button = QPushButton("Find files", self)
        self.files = QTreeWidget(self)
        self.files.setHeaderLabels(["File", "Quantization", "Size"])
        self.files.setRootIsDecorated(False)
        self.files.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        header = self.files.header()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in (1, 2):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.message = QLabel(f"Saved to {self.folder}", self)
        self.message.setObjectName("mutedLabel")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.progress = QProgressBar(self)
        self.progress.setRange(0, 1000)
        self.progress.hide()
        self.download_button = QPushButton("Download", self)
        self.download_button.setDefault(True)
        self.download_button.setEnabled(False)
        self.cancel_button = QPushButton("Cancel download", self)
        self.cancel_button.hide()
        self.close_button = QPushButton("Close", self)

        row = QHBoxLayout()
        row.addWidget(self.source, 1)
        row.addWidget(self.find_button)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        for button in (self.download_button, self.cancel_button, self.close_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Hugging Face repo or file URL", self))
        layout.addLayout(row)
        layout.addWidget(self.files, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.message)
        layout.addLayout(buttons)

        self.source.returnPressed.connect(self.find_files)
        self.find_button.clicked.connect(self.find_files)
        self.files.itemSelectionChanged.connect(self._update_buttons)
        self.files.itemDoubleClicked.connect(lambda *_args: self.start_download())
        self.download_button.clicked.connect(self.start_download)
        self.cancel_button.clicked.connect(self.worker.cancel)
        self.close_button.clicked.connect(self.reject)
        self.worker.listed.connect(self._on_listed)
        self.worker.list_failed.connect(self._on_list_failed)
        self._progress_timer = QTimer(self, interval=PROGRESS_INTERVAL_MS)
        self._progress_timer.timeout.connect(lambda: self._on_progress(*self.worker.latest))
        self.worker.downloaded.connect(self._on_downloaded)
        self.worker.download_failed.connect(self._on_download_failed)
        self.worker.cancelled.connect(self._on_cancelled)

    # -- finding ----------------------------------------------------------------------

    def find_files(self) -> None:
        if self._busy:
            return
        try:
            source = parse_source(self.source.text())
        except ValueError as error:
            self._say(str(error), error=True)
            return
        self.files.clear()
        self._choices = []
        self._say(f"Looking up {source.repo_id}…")
        self._set_busy(True)
        self.worker.list_files(source)

    def _on_listed(self, source: HubSource, choices: list[HubChoice]) -> None:
        self._set_busy(False)
        self._source, self._choices = source, choices
        if not choices:
            self._say(
                f"{source.repo_id} has no GGUF file or safetensors model this app can load.",
                error=True,
            )
            return
        for choice in choices:
            item = QTreeWidgetItem([choice.label, choice.quantization, size_text(choice.size)])
            item.setTextAlignment(2, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.files.addTopLevelItem(item)
        wanted = next((i for i, c in enumerate(choices) if c.label == source.filename), None)
        if wanted is not None:
            self.files.setCurrentItem(self.files.topLevelItem(wanted))
        self._say(f"{len(choices)} to choose from in {source.repo_id}. Saved to {self.folder}")
        self._update_buttons()

    def _on_list_failed(self, message: str) -> None:
        self._set_busy(False)
        self._say(message, error=True)

    # -- downloading ------------------------------------------------------------------

    def selected_choice(self) -> HubChoice | None:
        item = self.files.currentItem()
        if item is None or not item.isSelected():
            return None
        return self._choices[self.files.indexOfTopLevelItem(item)]

    def start_download(self) -> None:
        choice = self.selected_choice()
        if choice is None or self._source is None or self._busy:
            return
        self._say(f"Downloading {choice.label}…")
        self.progress.setValue(0)
        self.progress.show()
        self._set_busy(True, downloading=True)
        self.worker.download(self._source, choice, self.folder)
        self._progress_timer.start()

    def _on_progress(self, done: int, total: int) -> None:
        self.progress.setValue(int(1000 * done / total) if total else 0)
        self._say(f"{size_text(done)} of {size_text(total)}")

    def _on_downloaded(self, path: str) -> None:
        self._set_busy(False)
        self.progress.hide()
        self._say(f"Downloaded and checked: {path}")
        self.downloaded.emit(path)
        self.accept()

    def _on_download_failed(self, message: str) -> None:
        self._set_busy(False)
        self._say(message, error=True)
        self._update_buttons()
        if not self.isVisible():  # closed while it ran: the failure must still be seen
            self.open()

    def _on_cancelled(self) -> None:
        self._set_busy(False)
        self.progress.hide()
        self._say("Cancelled. What was downloaded is kept: Resume picks it up.")
        self._update_buttons()

    def reject(self) -> None:
        """Close (or Esc) hides the dialog; a download under way goes on, loads when it is
        done, and shows its progress when the dialog is opened again. Cancel stops it."""
        super().reject()

    # -- state ------------------------------------------------------------------------

    def _has_part(self, choice: HubChoice) -> bool:
        if self._source is None or choice.is_folder:
            return False
        target = destination(self.folder, self._source.repo_id, choice)
        return target.with_name(target.name + ".part").is_file()

    def _update_buttons(self) -> None:
        choice = self.selected_choice()
        self.download_button.setEnabled(choice is not None and not self._busy)
        resume = choice is not None and self._has_part(choice)
        self.download_button.setText("Resume download" if resume else "Download")

    def _set_busy(self, busy: bool, downloading: bool = False) -> None:
        self._busy = busy
        if not busy:
            self._progress_timer.stop()
        self.find_button.setEnabled(not busy)
        self.source.setEnabled(not busy)
        self.files.setEnabled(not busy)
        self.download_button.setEnabled(not busy and self.selected_choice() is not None)
        self.cancel_button.setVisible(busy and downloading)

    def _say(self, text: str, error: bool = False) -> None:
        self.message.setStyleSheet("color: #c0392b;" if error else "")
        self.message.setText(text)


def show_hub_download(
    parent: QWidget, on_downloaded: Callable[[str], None], folder: Path | None = None
) -> HubDownloadDialog:
    """Open the dialog (window-modal, not blocking); `on_downloaded` gets the path."""
    dialog = HubDownloadDialog(parent, folder)
    dialog.downloaded.connect(on_downloaded)
    dialog.open()
    return dialog
