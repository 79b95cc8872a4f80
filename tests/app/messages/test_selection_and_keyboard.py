"""Message text is selectable with the mouse and copied with Ctrl+C, and every message
action is reached and activated from the keyboard, with a focus ring and accessible
names; all driven with real mouse and key events on the message list."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
from PySide6.QtGui import QGuiApplication, QMouseEvent
from PySide6.QtWidgets import QApplication

from tests.app.messages.ui import open_with_reply

REPLY = "The quick brown fox jumps over the lazy dog."


def char_point(window, row: int, position: int) -> QPoint:
    """Where character `position` of message `row`'s text is drawn (viewport pixels)."""
    view = window.chat.list_view
    index = window.controller.model.index(row)
    geometry, rendered = view.delegate.geometry(view.visualRect(index), index)
    doc = rendered.markdown.doc
    block = doc.findBlock(position)
    layout = block.layout()
    line = layout.lineForTextPosition(position - block.position())
    origin = doc.documentLayout().blockBoundingRect(block).topLeft() + layout.position()
    x = origin.x() + line.cursorToX(position - block.position())[0] + 1
    y = origin.y() + line.y() + line.height() / 2
    return geometry.text.topLeft() + QPoint(round(x), round(y))


def drag(view, start: QPoint, end: QPoint, qtbot) -> None:
    viewport = view.viewport()
    qtbot.mousePress(viewport, Qt.MouseButton.LeftButton, pos=start)
    for fraction in (0.3, 0.7, 1.0):  # a drag moves through the text with the button held
        point = QPointF(start + (end - start) * fraction)
        move = QMouseEvent(QEvent.Type.MouseMove, point, viewport.mapToGlobal(point),
                           Qt.MouseButton.NoButton, Qt.MouseButton.LeftButton,
                           Qt.KeyboardModifier.NoModifier)  # fmt: skip
        QApplication.sendEvent(viewport, move)
    qtbot.mouseRelease(viewport, Qt.MouseButton.LeftButton, pos=end)


def test_a_drag_selects_text_and_ctrl_c_copies_it(harness, qtbot):
    window = open_with_reply(harness, REPLY)
    harness.send("Say the pangram, line one\nline two")
    view = window.chat.list_view
    start, end = REPLY.index("quick"), REPLY.index(" fox")
    drag(view, char_point(window, 1, start), char_point(window, 1, end), qtbot)
    assert view.selected_text() == "quick brown"
    QGuiApplication.clipboard().clear()
    qtbot.keyClick(view, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert QGuiApplication.clipboard().text() == "quick brown"
    # A person's message too, across its line break.
    question = "Say the pangram, line one\nline two"
    drag(view, char_point(window, 0, question.index("one")), char_point(window, 0, len(question)),
         qtbot)  # fmt: skip
    qtbot.keyClick(view, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert QGuiApplication.clipboard().text() == "one\nline two"


def test_a_double_click_selects_a_word_and_ctrl_a_the_message(harness, qtbot):
    window = open_with_reply(harness, REPLY)
    harness.send("pangram please")
    view = window.chat.list_view
    qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton,
                      pos=char_point(window, 1, REPLY.index("jumps") + 2))  # fmt: skip
    assert view.selected_text() == "jumps"
    qtbot.keyClick(view, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClick(view, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert QGuiApplication.clipboard().text() == REPLY


def test_every_action_is_reached_and_activated_from_the_keyboard(harness, qtbot):
    window = open_with_reply(harness, REPLY)
    harness.send("first question")
    view = window.chat.list_view
    window.activateWindow()
    window.composer.edit.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.composer.edit)
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Backtab)  # Shift+Tab: up to the list
    assert QApplication.focusWidget() is view
    assert view.focused_control() == (1, None)  # the newest message
    assert view.accessibleDescription().startswith("Assistant reply, 2 of 2: The quick")

    names = []
    for _ in range(4):
        qtbot.keyClick(view, Qt.Key.Key_Tab)
        names.append(view.accessibleDescription().split(". ", 1)[1])
    assert names == ["Edit reply, button", "Regenerate reply, button", "Copy reply, button",
                     "Branch into a new chat up to here, button"]  # fmt: skip
    qtbot.keyClick(view, Qt.Key.Key_Left)
    qtbot.keyClick(view, Qt.Key.Key_Return)  # Copy
    assert QGuiApplication.clipboard().text() == REPLY
    qtbot.keyClick(view, Qt.Key.Key_Left)
    qtbot.keyClick(view, Qt.Key.Key_Space)  # Regenerate
    harness.wait_idle()
    assert window.controller.model.item(1).sibling_count == 2

    # The branch arrows are controls too: Shift+Tab back to "previous branch" and press.
    view.setFocus()
    qtbot.keyClick(view, Qt.Key.Key_End)
    qtbot.keyClick(view, Qt.Key.Key_Tab)
    assert view.accessibleDescription().endswith("Previous branch (2 of 2), button")
    qtbot.keyClick(view, Qt.Key.Key_Return)
    assert window.controller.model.item(1).sibling_index == 1
    assert view.focused_control()[1] == ("prev", None)  # still on the arrows
    qtbot.keyClick(view, Qt.Key.Key_Tab)
    qtbot.keyClick(view, Qt.Key.Key_Return)
    assert window.controller.model.item(1).sibling_index == 2

    # Up reaches the question; its Edit opens the in-place editor.
    qtbot.keyClick(view, Qt.Key.Key_Up)
    assert view.accessibleDescription().startswith("Your message, 1 of 2: first question")
    qtbot.keyClick(view, Qt.Key.Key_Tab)
    qtbot.keyClick(view, Qt.Key.Key_Return)
    assert window.chat.editing_id == window.controller.model.item(0).id


def test_the_focused_control_has_a_visible_ring(harness, qtbot):
    window = open_with_reply(harness, REPLY)
    harness.send("q")
    view = window.chat.list_view
    window.activateWindow()
    view.setFocus()
    qtbot.waitUntil(view.hasFocus)
    qtbot.keyClick(view, Qt.Key.Key_Tab)  # onto "Edit"
    index = window.controller.model.index(1)
    geometry, _ = view.delegate.geometry(view.visualRect(index), index)
    edit = dict(geometry.actions)["Edit"]
    ring = edit.adjusted(-3, -3, 3, 3)
    focused = view.viewport().grab(ring).toImage()
    window.composer.edit.setFocus()
    qtbot.waitUntil(lambda: not view.hasFocus())
    unfocused = view.viewport().grab(ring).toImage()
    assert focused != unfocused
    accent = window.chat.delegate.theme.accent.lower()
    top_edge = {focused.pixelColor(x, 1).name() for x in range(6, focused.width() - 6)}
    assert accent in top_edge


def test_tab_past_the_last_control_leaves_the_list(harness, qtbot):
    window = open_with_reply(harness, REPLY)
    harness.send("q")
    view = window.chat.list_view
    window.activateWindow()
    view.setFocus()
    qtbot.waitUntil(view.hasFocus)
    for _ in range(4):  # Edit, Regenerate, Copy, Branch
        qtbot.keyClick(view, Qt.Key.Key_Tab)
        assert view.hasFocus()
    assert view.focused_control() == (1, ("branch", None))
    qtbot.keyClick(view, Qt.Key.Key_Tab)
    assert not view.hasFocus() and QApplication.focusWidget() is not None


def test_the_ring_shows_for_the_keyboard_not_after_a_click(harness, qtbot):
    window = open_with_reply(harness, REPLY)
    harness.send("q")
    view = window.chat.list_view
    window.activateWindow()
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=char_point(window, 1, 3))
    assert view.hasFocus() and view.delegate.focus is None
    qtbot.keyClick(view, Qt.Key.Key_Tab)
    assert view.delegate.focus == (1, ("edit", None))
