"""How a message reads once sent: a person's text exactly as typed, a reply as Markdown,
and a reply that opens with a code block clear of the "Assistant" label."""

from __future__ import annotations

from PySide6.QtCore import QRect
from PySide6.QtGui import QTextCursor

from tests.app.fake_engine import FakeEngine


def open_with_reply(harness, reply: str):
    def factory(listener):
        harness.engine = FakeEngine(listener, reply=lambda _command: reply)
        return harness.engine

    return harness.open(engine_factory=factory)


def _document(window, row: int):
    item = window.controller.model.item(row)
    return window.chat.delegate.rendered(item, window.chat.list_view.layout_width()).markdown.doc


def _is_italic_at(doc, text: str) -> bool:
    cursor = QTextCursor(doc)
    cursor.setPosition(doc.toPlainText().index(text) + 1)
    return cursor.charFormat().fontItalic()


def test_a_user_message_is_shown_as_typed_and_a_reply_as_markdown(harness, qtbot):
    typed = "line one\nline *two* and _three_\n  indented   with spaces\n\n# not a heading"
    window = open_with_reply(harness, "The *reply* is Markdown\nand this joins the line.")
    harness.send(typed)
    user_doc = _document(window, 0)
    assert user_doc.toPlainText() == typed
    assert not _is_italic_at(user_doc, "two")
    reply_doc = _document(window, 1)
    assert reply_doc.toPlainText() == "The reply is Markdown and this joins the line."
    assert _is_italic_at(reply_doc, "reply")


def test_a_reply_opening_with_a_code_block_draws_it_inside_the_bubble(harness, qtbot):
    window = open_with_reply(harness, "```python\nprint('hi')\n```\n\nThat prints hi.")
    harness.send("show me code")
    view = window.chat.list_view
    index = window.controller.model.index(1)
    geometry, rendered = view.delegate.geometry(view.visualRect(index), index)
    (frame,) = rendered.code_rects
    painted = frame.translated(geometry.text.x(), geometry.text.y()).toRect()
    assert painted.top() >= geometry.bubble.top()
    assert not painted.intersects(geometry.role_label)
    assert not painted.intersects(QRect(geometry.header))
    # The code's own text starts below the frame's header strip, inside the frame.
    first_line = rendered.markdown.doc.documentLayout().blockBoundingRect(
        rendered.markdown.doc.begin()
    )
    assert first_line.top() >= frame.top() + 30


def test_branch_into_a_new_chat_from_a_message(harness, qtbot):
    from tests.app.messages.ui import click_control

    window = harness.open()
    for text in ("first", "second", "third"):
        harness.send(text)
    original = window.controller.conversation_id
    click_control(window, qtbot, 3, "Branch")  # the reply to "second"
    qtbot.waitUntil(lambda: window.controller.conversation_id != original)
    assert harness.texts() == ["first", "Echo: first", "second", "Echo: second"]
    titles = [c.title for c in harness.store.list_conversations()]
    assert titles[0] == "first (branch)" and "first" in titles
    kept = [n.content for n in harness.store.load_tree(original).selected_path()]
    assert kept == ["first", "Echo: first", "second", "Echo: second", "third", "Echo: third"]
    harness.send("a new question here")  # the copy goes on on its own
    assert harness.texts()[-1] == "Echo: a new question here"
    assert len(harness.store.load_tree(original).selected_path()) == 6
