"""A reasoning reply's thinking part: streamed into a collapsed "Thinking (N tokens)"
block above the answer, stored apart from it, and opened by a click or from the keyboard."""

from __future__ import annotations

from PySide6.QtCore import Qt

from tests.app.messages.ui import ThinkingEngine, open_thinking


def geometry_of(window, row: int):
    view = window.chat.list_view
    index = window.controller.model.index(row)
    return view.delegate.geometry(view.visualRect(index), index)[0]


def test_thinking_streams_collapsed_is_stored_apart_and_opens_on_click(harness, qtbot):
    window = open_thinking(harness)
    harness.engine.pause_after = 3  # three tokens of thinking, no answer yet
    harness.send("hi", wait=False)
    model = window.controller.model
    qtbot.waitUntil(lambda: model.rowCount() == 2 and model.item(1).thinking_tokens == 3)
    streaming = model.item(1)
    assert streaming.thinking == "The user greets" and streaming.content == ""
    assert window.chat.delegate.thinking_label(streaming) == "Thinking… (3 tokens)"
    assert geometry_of(window, 1).thinking_box is None  # collapsed while it streams
    harness.engine.resume()
    harness.wait_idle()

    reply = model.item(1)
    assert reply.content == ThinkingEngine.answer and reply.thinking == ThinkingEngine.thinking
    assert window.chat.delegate.thinking_label(reply) == "Thinking (9 tokens)"
    stored = harness.store.load_tree(window.controller.conversation_id).node(reply.id)
    assert (stored.content, stored.thinking) == (ThinkingEngine.answer, ThinkingEngine.thinking)

    view = window.chat.list_view
    toggle = geometry_of(window, 1).thinking_toggle
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=toggle.center())
    geometry = geometry_of(window, 1)
    assert geometry.thinking_box is not None
    assert geometry.thinking_box.bottom() < geometry.bubble.top()  # above the answer
    rendered = window.chat.delegate.rendered_thinking(reply, view.layout_width())
    assert rendered.markdown.doc.toPlainText() == ThinkingEngine.thinking
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=toggle.center())
    assert geometry_of(window, 1).thinking_box is None

    harness.open(engine_factory=lambda listener: ThinkingEngine(listener))  # after a restart
    harness.window.controller.open_conversation(harness.store.list_conversations()[0].id)
    reopened = harness.window.controller.model.item(1)
    assert reopened.thinking == ThinkingEngine.thinking and reopened.thinking_tokens == 9


def test_the_thinking_block_opens_from_the_keyboard(harness, qtbot):
    window = open_thinking(harness)
    harness.send("hi")
    view = window.chat.list_view
    window.activateWindow()
    view.setFocus()
    qtbot.waitUntil(view.hasFocus)
    qtbot.keyClick(view, Qt.Key.Key_Tab)  # the reply's first control: its thinking
    assert view.accessibleDescription().endswith("Thinking (9 tokens): show or hide, button")
    qtbot.keyClick(view, Qt.Key.Key_Return)
    assert geometry_of(window, 1).thinking_box is not None
    qtbot.keyClick(view, Qt.Key.Key_Space)
    assert geometry_of(window, 1).thinking_box is None
