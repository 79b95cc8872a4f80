"""The controller's own refusals: with no model a send creates nothing, and a send while
a reply is being written is refused out loud; both leave the text with the person."""

from __future__ import annotations

from PySide6.QtCore import Qt

from engine.events import Generate


def test_sending_with_no_model_creates_no_chat_and_says_why(harness, qtbot):
    window = harness.open(with_model=False)
    refusals: list[str] = []
    window.controller.send_refused.connect(refusals.append)
    assert not window.controller.send("hello?")
    assert harness.store.list_conversations() == []
    assert window.controller.conversation_id is None
    assert refusals and "No model is loaded" in refusals[-1]
    # The way a person sends: the text stays in the box and no chat appears.
    window.composer.edit.setPlainText("hello again")
    window.composer.edit.setFocus()
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    qtbot.wait(50)
    assert harness.store.list_conversations() == []
    assert window.composer.edit.toPlainText() == "hello again"
    assert not any(isinstance(c, Generate) for c in harness.engine.commands)


def test_once_a_model_loads_the_send_goes_through(harness, qtbot):
    window = harness.open(with_model=False)
    window.model_loader.load("/models/any.gguf")
    qtbot.waitUntil(lambda: window.header.name.text() == "Fake-1M")
    harness.send("now it works")
    assert harness.texts() == ["now it works", "Echo: now it works"]


def test_a_send_during_a_reply_is_refused_out_loud(harness, qtbot):
    window = harness.open()
    harness.engine.pause_after = 1
    harness.send("a long story please", wait=False)
    qtbot.waitUntil(lambda: window.controller.is_busy)
    refusals: list[str] = []
    window.controller.send_refused.connect(refusals.append)
    assert not window.controller.send("and another thing")
    assert refusals and "still being written" in refusals[-1]
    assert harness.texts()[0] == "a long story please" and len(harness.texts()) == 2
    window.controller.stop()
    harness.wait_idle()


def test_the_window_shows_why_a_send_was_refused(harness, qtbot):
    window = harness.open(with_model=False)
    window.controller.send("hello?")
    assert window.banner.isVisible()
    assert "No model is loaded" in window.banner.message.text()


def test_an_edit_refused_for_want_of_a_model_keeps_the_editor_and_its_text(harness, qtbot):
    from tests.app.messages.ui import click_control

    harness.open()
    harness.send("the first question")
    window = harness.open(with_model=False)  # the next start, before any model loads
    window.controller.open_conversation(harness.store.list_conversations()[0].id)
    click_control(window, qtbot, 0, "Edit")
    editor = window.chat.editor()
    editor.text_edit.setPlainText("the question, better put")
    editor.save_button.click()
    assert "No model is loaded" in window.banner.message.text()
    editor = window.chat.editor()
    assert editor is not None and editor.text == "the question, better put"
    assert len(harness.store.load_tree(window.controller.conversation_id)) == 2  # nothing added
