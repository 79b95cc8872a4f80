"""View ▸ Larger text, Smaller text and Actual size (Ctrl+=, Ctrl+-, Ctrl+0): the messages
and the message box change size together, the messages are laid out again at it, the
size is kept for the next start, and it stops at its bounds."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.settings.app_settings import TEXT_SIZES
from tests.app.chat.test_composer_keys import choose_in_settings
from tests.app.window.test_window_habits import menu_action


def sizes(window) -> tuple[float, float]:
    return (window.chat.list_view.font().pointSizeF(), window.composer.edit.font().pointSizeF())


def first_row_height(window) -> int:
    view = window.chat.list_view
    view.executeDelayedItemsLayout()
    return view.visualRect(view.model().index(0, 0)).height()


def test_larger_and_smaller_text_from_the_view_menu(harness, qtbot):
    window = harness.open()
    harness.send("a message long enough to wrap at a large size: " + "words " * 40)
    base = QApplication.font().pointSizeF()
    assert sizes(window) == (base, base)
    before = first_row_height(window)
    menu_action(window, "View", "Larger text").trigger()
    menu_action(window, "View", "Larger text").trigger()
    assert sizes(window) == (base + 2, base + 2) and window.settings.text_size == 2
    qtbot.waitUntil(lambda: first_row_height(window) > before)
    menu_action(window, "View", "Smaller text").trigger()
    assert sizes(window) == (base + 1, base + 1)

    window = harness.open()  # the size is kept, and Settings' OK keeps it too
    assert sizes(window) == (base + 1, base + 1)
    choose_in_settings(window, qtbot, "Ctrl+Enter sends")
    qtbot.waitUntil(lambda: window.settings.send_key == "ctrl_enter")
    assert window.settings.text_size == 1 and sizes(window) == (base + 1, base + 1)
    menu_action(window, "View", "Actual size").trigger()
    assert sizes(window) == (base, base) and window.settings.text_size == 0


def test_the_keys_change_the_size_and_it_stops_at_its_bounds(harness, qtbot):
    window = harness.open()
    base = QApplication.font().pointSizeF()
    edit = window.composer.edit
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is edit)
    ctrl = Qt.KeyboardModifier.ControlModifier
    qtbot.keyClick(edit, Qt.Key.Key_Equal, ctrl)
    assert sizes(window)[1] == base + 1
    qtbot.keyClick(edit, Qt.Key.Key_Minus, ctrl)
    qtbot.keyClick(edit, Qt.Key.Key_Minus, ctrl)
    assert sizes(window)[1] == base - 1
    qtbot.keyClick(edit, Qt.Key.Key_0, ctrl)
    assert sizes(window)[1] == base
    for _ in range(len(TEXT_SIZES) + 2):
        menu_action(window, "View", "Larger text").trigger()
    assert window.settings.text_size == TEXT_SIZES[-1]
    assert sizes(window) == (base + TEXT_SIZES[-1],) * 2
    assert not menu_action(window, "View", "Larger text").isEnabled()
    assert menu_action(window, "View", "Smaller text").isEnabled()
    qtbot.keyClick(edit, Qt.Key.Key_0, ctrl)  # back from the bound, the keys work again
    qtbot.keyClick(edit, Qt.Key.Key_Equal, ctrl)
    assert sizes(window)[1] == base + 1
