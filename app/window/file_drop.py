"""Files dropped on the window: a model (a .gguf file, or a folder holding a Hugging Face
checkpoint's config.json) loads as Model ▸ Open would load it, and a chat exported as
JSON (ours, ChatGPT's, Open WebUI's) is imported as the sidebar's Import would. Anything
else is refused while it is still being dragged, so the pointer says so before a drop
does something unexpected. Text dragged into the message box or the search field still
goes there; a file dragged over them comes here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEvent, QMimeData, QObject, Qt
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QWidget

DROP_EVENTS = (QEvent.Type.DragEnter, QEvent.Type.DragMove, QEvent.Type.Drop)


def dropped_file(mime: QMimeData) -> tuple[str, str] | None:
    """("model" or "chat", the path) for one local file the window takes, else None."""
    urls = mime.urls() if mime.hasUrls() else []
    if len(urls) != 1 or not urls[0].isLocalFile():
        return None
    path = Path(urls[0].toLocalFile())
    suffix = path.suffix.lower()
    if (path.is_file() and suffix == ".gguf") or (path / "config.json").is_file():
        return ("model", str(path))
    if path.is_file() and suffix == ".json":
        return ("chat", str(path))
    return None


class FileDrop(QObject):
    """Takes file drops on `window` and on `fields` (widgets that take dropped text: their
    file drags come here instead)."""

    def __init__(
        self,
        window: QWidget,
        fields: tuple[QWidget, ...],
        load_model: Callable[[str], None],
        import_chat: Callable[[str], None],
    ) -> None:
        super().__init__(window)
        self._open = {"model": load_model, "chat": import_chat}
        window.setAcceptDrops(True)
        for widget in (window, *fields):
            widget.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() not in DROP_EVENTS:
            return False
        assert isinstance(event, QDropEvent)  # drag enter and move events are drop events
        found = dropped_file(event.mimeData())
        if found is None:
            return False  # text for a field; on the window itself nothing accepts it
        event.setDropAction(Qt.DropAction.CopyAction)
        event.accept()
        if event.type() == QEvent.Type.Drop:
            kind, path = found
            self._open[kind](path)
        return True
