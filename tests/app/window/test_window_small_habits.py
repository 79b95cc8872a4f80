"""Issue 17's smaller points, as a person meets them: banners that clear themselves once
the problem is fixed, a send with no model refused before anything is created, one
unsent draft per chat, a send during a reply refused visibly, Copy that says so, and
the export dialog opening in a sensible folder."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QStandardPaths, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog, QLabel

from engine.events import Failed, ModelLoaded
from tests.app.window.test_window import click_action
from tests.app.window.test_window_habits import menu_action

LOADED = ModelLoaded("/models/m.gguf", "Fake-1M", "llama", 1_000_000, "F32", 2048, "cpu")


def ready(harness, qtbot):
    """A window with a model loaded, as after start-up."""
    window = harness.open()
    window.model_loader.load("/models/m.gguf")
    qtbot.waitUntil(lambda: window.header.name.text() == "Fake-1M")
    return window


def press_enter(qtbot, window, text: str) -> None:
    edit = window.composer.edit
    edit.setFocus()
    qtbot.keyClicks(edit, text)
    qtbot.keyClick(edit, Qt.Key.Key_Return)


def test_a_load_error_banner_clears_when_a_model_loads(harness, qtbot):
    window = harness.open(with_model=False)
    window.bridge._listen(Failed("", "bad.gguf: not a GGUF file", "bad magic", "bad.gguf"))
    qtbot.waitUntil(window.banner.isVisible)
    assert "not a GGUF file" in window.banner.message.text()
    window.model_loader.load("/models/good.gguf")
    qtbot.waitUntil(lambda: window.header.name.text() == "Fake-1M")
    assert not window.banner.isVisible()


def test_a_request_error_banner_clears_after_the_next_reply(harness, qtbot):
    window = ready(harness, qtbot)
    harness.engine.fail_next = ("The model ran out of memory.", "MemoryError")
    harness.send("first")
    qtbot.waitUntil(window.banner.isVisible)
    harness.send("second")
    assert not window.banner.isVisible()


def test_an_unrelated_banner_stays(harness, qtbot):
    window = ready(harness, qtbot)
    harness.engine.fail_next = ("The model ran out of memory.", "MemoryError")
    harness.send("first")
    qtbot.waitUntil(window.banner.isVisible)
    window.model_loader.load("/models/other.gguf")  # a load fixes nothing about a request
    qtbot.waitUntil(
        lambda: len([c for c in harness.engine.commands if "LoadModel" in type(c).__name__]) == 2
    )
    qtbot.wait(50)
    assert window.banner.isVisible()


def test_sending_with_no_model_is_refused_up_front(harness, qtbot):
    window = harness.open(with_model=False)
    press_enter(qtbot, window, "hello?")
    assert window.banner.isVisible()
    assert "No model is loaded" in window.banner.message.text()
    assert window.composer.edit.toPlainText() == "hello?"  # kept
    assert harness.store.list_conversations() == []  # no empty chat
    assert harness.engine.generates() == []
    window.model_loader.load("/models/m.gguf")
    qtbot.waitUntil(lambda: window.header.name.text() == "Fake-1M")
    assert not window.banner.isVisible()
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    harness.wait_idle()
    assert harness.texts() == ["hello?", "Echo: hello?"]


def test_a_failed_load_that_kept_the_old_model_still_sends(harness, qtbot):
    window = ready(harness, qtbot)
    window.bridge._listen(Failed("", "new.gguf is broken", "", "new.gguf", "/models/m.gguf"))
    qtbot.waitUntil(window.banner.isVisible)
    harness.send("still there?")
    assert harness.texts() == ["still there?", "Echo: still there?"]


def test_each_chat_keeps_its_own_unsent_draft(harness, qtbot):
    window = ready(harness, qtbot)
    harness.send("chat A")
    chat_a = window.controller.conversation_id
    qtbot.mouseClick(window.sidebar.new_button, Qt.MouseButton.LeftButton)
    harness.send("chat B")
    chat_b = window.controller.conversation_id
    edit = window.composer.edit

    qtbot.keyClicks(edit, "half a thought for B")
    window.sidebar.conversation_selected.emit(chat_a)
    assert window.controller.conversation_id == chat_a
    assert edit.toPlainText() == ""
    qtbot.keyClicks(edit, "draft for A")
    window.sidebar.conversation_selected.emit(chat_b)
    assert edit.toPlainText() == "half a thought for B"
    qtbot.mouseClick(window.sidebar.new_button, Qt.MouseButton.LeftButton)
    assert edit.toPlainText() == ""
    qtbot.keyClicks(edit, "a new chat's first words")
    window.sidebar.conversation_selected.emit(chat_a)
    assert edit.toPlainText() == "draft for A"
    qtbot.mouseClick(window.sidebar.new_button, Qt.MouseButton.LeftButton)
    assert edit.toPlainText() == "a new chat's first words"
    qtbot.keyClick(edit, Qt.Key.Key_Return)  # the new chat is created: its draft was sent
    harness.wait_idle()
    assert edit.toPlainText() == ""
    window.sidebar.conversation_selected.emit(chat_a)
    assert edit.toPlainText() == "draft for A"


def test_a_send_during_a_reply_is_refused_visibly_and_kept(harness, qtbot):
    window = ready(harness, qtbot)
    harness.engine.pause_after = 2
    harness.send("tell me a long story", wait=False)
    qtbot.waitUntil(lambda: window.controller.is_busy)
    press_enter(qtbot, window, "and another thing")
    assert window.banner.isVisible()
    assert "still being written" in window.banner.message.text()
    assert window.composer.edit.toPlainText() == "and another thing"
    assert len(harness.engine.generates()) == 1
    harness.engine.resume()
    harness.wait_idle()
    assert not window.banner.isVisible()  # the reply ended: the reason is gone
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    harness.wait_idle()
    assert harness.texts()[-2:] == ["and another thing", "Echo: and another thing"]


def test_copy_says_it_copied(harness, qtbot):
    window = ready(harness, qtbot)
    harness.send("copy me")
    click_action(harness, qtbot, 1, "Copy")
    assert QGuiApplication.clipboard().text() == "Echo: copy me"
    assert window.banner.isVisible()
    assert window.banner.message.text() == "Copied the message to the clipboard."


def test_export_opens_in_documents_then_where_the_last_export_went(
    harness, qtbot, tmp_path, monkeypatch
):
    window = ready(harness, qtbot)
    harness.send("Porto plans")
    asked: list[str] = []
    target = tmp_path / "exports" / "porto.md"
    target.parent.mkdir()

    def save_dialog(_parent, _caption, suggested, _filter):
        asked.append(suggested)
        return str(target), "Markdown (*.md)"

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_dialog)
    menu_action(window, "File", "Export chat as Markdown").trigger()
    documents = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    expected = documents if Path(documents).is_dir() else str(Path.home())
    assert Path(asked[0]).parent == Path(expected)
    assert Path(asked[0]).name == "Porto plans.md"
    assert "Porto plans" in target.read_text(encoding="utf-8")

    menu_action(window, "File", "Export chat as JSON").trigger()
    assert Path(asked[1]) == target.parent / "Porto plans.json"
    window = harness.open()  # remembered across a restart
    harness.send("again")
    menu_action(window, "File", "Export chat as Markdown").trigger()
    assert Path(asked[2]).parent == target.parent


def test_a_long_model_name_ends_in_an_ellipsis_in_a_narrow_window(harness, qtbot):
    window = harness.open()
    name = "Meta-Llama-3.1-8B-Instruct-abliterated-imatrix-Q4_K_M"
    header = window.header
    header.show_loaded(ModelLoaded(f"/models/{name}.gguf", name, "llama", 8 * 10**9, "Q4_K_M",
                                   131072, "cpu"))  # fmt: skip
    window.resize(640, 700)
    qtbot.waitUntil(lambda: QLabel.text(header.name).endswith("…"))  # what is painted
    assert header.name.geometry().right() < header.picker.geometry().left()
    assert header.name.text() == name and header.name.toolTip() == name
    window.resize(1600, 700)  # room again: the whole name, no tooltip
    qtbot.waitUntil(lambda: QLabel.text(header.name) == name)
    assert header.name.toolTip() == ""
