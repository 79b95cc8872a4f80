"""Chat ▸ Regenerate reply (Ctrl+R), Previous / Next version (Ctrl+[, Ctrl+]), Copy reply
(Ctrl+Shift+C) and Edit last message: the last reply of the branch shown, from the keys in
the message box and from the menu, greyed while the menu is open where they would do
nothing and live again once it closes."""

from __future__ import annotations

import itertools

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.theme import DARK, LIGHT
from tests.app.fake_engine import FakeEngine
from tests.app.window.test_window_habits import menu_action

CTRL = Qt.KeyboardModifier.ControlModifier


def numbered(harness):
    """The window over a fake engine whose replies are Answer 1, Answer 2, ..."""
    counter = itertools.count(1)

    def factory(listener):
        harness.engine = FakeEngine(listener, lambda _command: f"Answer {next(counter)}")
        return harness.engine

    return harness.open(engine_factory=factory)


def _focused_box(window, qtbot):
    edit = window.composer.edit
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is edit)
    return edit


def test_ctrl_r_regenerates_and_the_brackets_walk_its_versions(harness, qtbot):
    window = numbered(harness)
    harness.send("question")
    edit = _focused_box(window, qtbot)
    qtbot.keyClick(edit, Qt.Key.Key_R, CTRL)
    harness.wait_idle()
    assert harness.texts() == ["question", "Answer 2"]
    reply = harness.items()[1]
    assert (reply.sibling_index, reply.sibling_count) == (2, 2)
    qtbot.keyClick(edit, Qt.Key.Key_BracketLeft, CTRL)
    qtbot.waitUntil(lambda: harness.texts() == ["question", "Answer 1"])
    assert harness.items()[1].sibling_index == 1
    qtbot.keyClick(edit, Qt.Key.Key_BracketLeft, CTRL)  # the first version: nothing before
    assert harness.texts() == ["question", "Answer 1"]
    qtbot.keyClick(edit, Qt.Key.Key_BracketRight, CTRL)
    qtbot.waitUntil(lambda: harness.texts() == ["question", "Answer 2"])
    menu_action(window, "Chat", "Regenerate reply").trigger()  # the menu does the same
    harness.wait_idle()
    assert harness.texts() == ["question", "Answer 3"]
    assert harness.items()[1].sibling_count == 3
    menu_action(window, "Chat", "Previous version").trigger()
    qtbot.waitUntil(lambda: harness.texts() == ["question", "Answer 2"])
    menu_action(window, "Chat", "Next version").trigger()
    qtbot.waitUntil(lambda: harness.texts() == ["question", "Answer 3"])
    siblings = window.controller.tree.siblings(harness.items()[1].id)  # as the store has them
    assert [node.content for node in siblings] == ["Answer 1", "Answer 2", "Answer 3"]


def test_ctrl_shift_c_copies_the_last_reply(harness, qtbot):
    window = numbered(harness)
    harness.send("first")
    harness.send("second")
    QApplication.clipboard().setText("before")
    shift = Qt.KeyboardModifier.ShiftModifier
    qtbot.keyClick(_focused_box(window, qtbot), Qt.Key.Key_C, CTRL | shift)
    assert QApplication.clipboard().text() == "Answer 2"
    assert window.banner.message.text() == "Copied the reply to the clipboard."
    QApplication.clipboard().setText("before")
    menu_action(window, "Chat", "Copy reply").trigger()
    assert QApplication.clipboard().text() == "Answer 2"


def test_edit_last_message_opens_the_editor_on_it(harness, qtbot):
    window = numbered(harness)
    harness.send("first")
    harness.send("second")
    menu_action(window, "Chat", "Edit last message").trigger()
    model = window.chat.model
    assert model.editing_id is not None
    assert model.item(model.row_of(model.editing_id)).content == "second"


def test_the_menu_greys_what_would_do_nothing_and_the_keys_stay_live(harness, qtbot):
    window = numbered(harness)
    names = ("Regenerate reply", "Previous version", "Next version", "Copy reply", "Edit last")
    actions = [menu_action(window, "Chat", name) for name in names]
    menu = actions[0].parent()
    menu.aboutToShow.emit()  # no chat yet: nothing to act on
    assert [a.isEnabled() for a in actions] == [False] * 5
    menu.aboutToHide.emit()
    assert all(a.isEnabled() for a in actions)
    harness.send("question")
    menu.aboutToShow.emit()  # one version: nothing to walk to
    assert [a.isEnabled() for a in actions] == [True, False, False, True, True]
    menu.aboutToHide.emit()
    qtbot.keyClick(_focused_box(window, qtbot), Qt.Key.Key_R, CTRL)
    harness.wait_idle()
    menu.aboutToShow.emit()  # version 2 of 2: only back
    assert [a.isEnabled() for a in actions] == [True, True, False, True, True]
    menu.aboutToHide.emit()
    harness.engine.pause_after = 1  # while a reply streams nothing but Copy is offered
    harness.send("another", wait=False)
    qtbot.waitUntil(lambda: harness.texts()[-1] == "Answer")
    menu.aboutToShow.emit()
    assert [a.isEnabled() for a in actions] == [False, False, False, True, False]
    menu.aboutToHide.emit()
    window.controller.stop()
    harness.engine.resume()
    harness.wait_idle()


def test_the_keys_are_listed_in_help(harness):
    from app.window.help_dialogs import window_shortcuts

    rows = window_shortcuts(harness.open())
    for row in (("Regenerate reply", "Ctrl+R"), ("Previous version", "Ctrl+["),
                ("Next version", "Ctrl+]"), ("Copy reply", "Ctrl+Shift+C")):  # fmt: skip
        assert row in rows, rows


def _text_lightness(image, rect) -> int:
    """The lightness of an item's text in `image`: its pixel furthest from the menu's
    background (the darkest on a light theme, the lightest on a dark one)."""
    background = image.pixelColor(rect.right() - 2, rect.top() + 2).lightness()
    values = [
        image.pixelColor(x, y).lightness()
        for x in range(rect.left(), rect.right())
        for y in range(rect.top(), rect.bottom())
    ]
    return max(values, key=lambda value: abs(value - background))


def test_a_greyed_entry_looks_greyed(harness, qtbot):
    """The theme's style sheet colours every menu item: without its disabled rule (and the
    palette's disabled group) a greyed entry was drawn as dark as a live one."""
    window = numbered(harness)
    app, palette = QApplication.instance(), QApplication.palette()
    for theme in (LIGHT, DARK):
        window.set_theme(theme)
        try:
            _greyed_against_live(window, harness, qtbot)
        finally:
            app.setStyleSheet("")  # the style sheet and palette are application-wide
            app.setPalette(palette)


def _greyed_against_live(window, harness, qtbot) -> None:
    harness.send("question")
    regenerate = menu_action(window, "Chat", "Regenerate reply")
    previous = menu_action(window, "Chat", "Previous version")  # one version: greyed
    menu = regenerate.parent()
    menu.popup(window.mapToGlobal(window.rect().center()))
    qtbot.waitUntil(menu.isVisible)
    assert regenerate.isEnabled() and not previous.isEnabled()
    image = menu.grab().toImage()
    live = _text_lightness(image, menu.actionGeometry(regenerate))
    greyed = _text_lightness(image, menu.actionGeometry(previous))
    menu.close()
    assert abs(greyed - live) > 40, (live, greyed)
