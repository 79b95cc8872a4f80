"""Files dropped on the window: a .gguf (or a checkpoint folder) loads, an exported chat is
imported and opens, anything else is refused while it is dragged; text dropped into the
message box still lands there. Qt's drag manager sends these events to the widget under
the pointer that takes drops (the window itself where a message list or header is under
it); the tests send them to those widgets."""

from __future__ import annotations

import json

from PySide6.QtCore import QMimeData, QPoint, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication

from engine import events as ev
from tests.app.conversation.test_import_formats import chatgpt_export


def files(*paths) -> QMimeData:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path)) for path in paths])
    return mime


def drag_and_drop(widget, mime: QMimeData) -> bool:
    """Drag `mime` onto `widget` and drop it where the drag was accepted; whether it was."""
    at = QPoint(widget.width() // 2, widget.height() // 2)
    buttons, keys = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    enter = QDragEnterEvent(at, Qt.DropAction.CopyAction, mime, buttons, keys)
    QApplication.sendEvent(widget, enter)
    if not enter.isAccepted():
        return False
    drop = QDropEvent(at.toPointF(), Qt.DropAction.CopyAction, mime, buttons, keys)
    QApplication.sendEvent(widget, drop)
    return drop.isAccepted()


def loads(harness) -> list[str]:
    return [c.path for c in harness.engine.commands if isinstance(c, ev.LoadModel)]


def test_a_gguf_dropped_on_the_window_or_the_message_box_loads(harness, qtbot, tmp_path):
    window = harness.open()
    model = tmp_path / "Some-Model.Q4_K_M.GGUF"  # the suffix in any case
    model.write_bytes(b"GGUF")
    assert drag_and_drop(window, files(model))
    qtbot.waitUntil(lambda: loads(harness) == [str(model)])
    qtbot.waitUntil(lambda: window.header.name.text() == "Fake-1M")
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert drag_and_drop(window.composer.edit.viewport(), files(folder))
    qtbot.waitUntil(lambda: loads(harness) == [str(model), str(folder)])
    assert window.composer.edit.toPlainText() == ""  # the path was not typed into it


def test_an_exported_chat_dropped_on_the_window_is_imported_and_opens(harness, qtbot, tmp_path):
    window = harness.open()
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(chatgpt_export(), ensure_ascii=False), encoding="utf-8")
    before = {c.id for c in harness.store.list_conversations()}
    assert drag_and_drop(window.sidebar.search, files(path))
    added = [c for c in harness.store.list_conversations() if c.id not in before]
    assert added and window.controller.conversation_id in {c.id for c in added}
    assert window.sidebar.search.text() == ""
    broken = tmp_path / "broken.json"
    broken.write_text("{ not json")
    assert drag_and_drop(window, files(broken))
    assert "Could not import broken.json." in window.banner.message.text()


def test_other_files_are_refused_and_text_still_drops_into_the_message_box(
    harness, qtbot, tmp_path
):
    window = harness.open()
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    two = [tmp_path / "a.gguf", tmp_path / "b.gguf"]
    for path in two:
        path.write_bytes(b"GGUF")
    assert not drag_and_drop(window, files(notes))
    assert not drag_and_drop(window, files(*two))  # one model at a time
    assert not drag_and_drop(window, files(tmp_path / "gone.gguf"))
    text = QMimeData()
    text.setText("dropped words")
    assert drag_and_drop(window.composer.edit.viewport(), text)
    assert window.composer.edit.toPlainText() == "dropped words"
    assert loads(harness) == [] and len(harness.store.list_conversations()) == 0
