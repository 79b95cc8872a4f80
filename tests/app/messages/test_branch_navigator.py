"""The branch navigator stays under the pointer: switching a branch keeps the message
whose arrows were clicked where it was, so clicking again at the same spot walks on."""

from __future__ import annotations

from PySide6.QtCore import Qt

from tests.app.messages.ui import click_control, control_rect

LONG = "\n\n".join(f"Paragraph {n} of a long question, long enough to wrap." for n in range(6))


def _edit(window, qtbot, harness, row: int, text: str) -> None:
    click_control(window, qtbot, row, "Edit")
    editor = window.chat.editor()
    editor.text_edit.setPlainText(text)
    editor.save_button.click()
    harness.wait_idle()


def test_repeated_clicks_at_one_spot_walk_the_branches(harness, qtbot):
    window = harness.open()
    for n in range(3):
        harness.send(f"{n}: {LONG}")
    # Two edits of the middle question: three branches, the newest two much shorter.
    _edit(window, qtbot, harness, 2, "1: short")
    _edit(window, qtbot, harness, 2, "1: a little longer\n\nthan the short one")
    view = window.chat.list_view
    view.scroll_to_bottom()
    qtbot.wait(50)
    assert view.verticalScrollBar().maximum() > 0, "the test needs a list that scrolls"
    assert window.controller.model.item(2).sibling_index == 3
    pointer = control_rect(window, 2, "prev").center()
    for expected_index, expected_start in ((2, "1: short"), (1, "1: Paragraph")):
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=pointer)
        qtbot.waitUntil(lambda s=expected_start: harness.texts()[2].startswith(s))
        qtbot.wait(50)  # any scrolling the switch causes happens here
        assert window.controller.model.item(2).sibling_index == expected_index
        assert control_rect(window, 2, "prev").contains(pointer), "the arrows moved away"
    assert len(harness.texts()) == 6
    # And forward again from the same arrows' spot.
    forward = control_rect(window, 2, "next").center()
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=forward)
    qtbot.waitUntil(lambda: harness.texts()[2] == "1: short")
    qtbot.wait(50)
    assert control_rect(window, 2, "next").contains(forward)
