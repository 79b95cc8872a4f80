"""Enter sends and Shift+Enter inserts a newline, as in every chat app; Settings can
switch to Ctrl+Enter (issue 17, item 4)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtWidgets import QApplication, QDialogButtonBox

from app.settings.settings_dialog import SettingsDialog

SHIFT = Qt.KeyboardModifier.ShiftModifier
CTRL = Qt.KeyboardModifier.ControlModifier


def type_text(qtbot, widget, text: str) -> None:
    widget.setFocus()
    qtbot.keyClicks(widget, text)


def test_enter_sends_and_shift_enter_makes_a_new_line(harness, qtbot):
    window = harness.open()
    edit = window.composer.edit
    type_text(qtbot, edit, "first line")
    qtbot.keyClick(edit, Qt.Key.Key_Return, SHIFT)
    qtbot.keyClicks(edit, "second line")
    assert edit.toPlainText() == "first line\nsecond line"
    assert harness.engine is not None and harness.engine.generates() == []
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    harness.wait_idle()
    assert harness.texts() == ["first line\nsecond line", "Echo: first line\nsecond line"]
    assert edit.toPlainText() == ""
    assert "Enter" in edit.placeholderText() and "Shift+Enter" in edit.placeholderText()


def test_keypad_enter_sends_too(harness, qtbot):
    window = harness.open()
    type_text(qtbot, window.composer.edit, "hello")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Enter, Qt.KeyboardModifier.KeypadModifier)
    harness.wait_idle()
    assert harness.texts() == ["hello", "Echo: hello"]


def choose_in_settings(window, qtbot, label: str) -> None:
    """Open Settings from the header's button, pick `label` for the send key, OK."""

    def answer() -> None:
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, SettingsDialog)
        index = dialog.send_key.findText(label)
        assert index >= 0, [dialog.send_key.itemText(i) for i in range(dialog.send_key.count())]
        dialog.send_key.setCurrentIndex(index)
        buttons = dialog.findChild(QDialogButtonBox)
        qtbot.mouseClick(
            buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.MouseButton.LeftButton
        )

    QTimer.singleShot(100, answer)
    qtbot.mouseClick(window.header.settings_button, Qt.MouseButton.LeftButton)


def test_ctrl_enter_mode_from_settings_survives_a_restart(harness, qtbot):
    window = harness.open()
    choose_in_settings(window, qtbot, "Ctrl+Enter sends")
    edit = window.composer.edit
    type_text(qtbot, edit, "one")
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    qtbot.keyClicks(edit, "two")
    assert edit.toPlainText() == "one\ntwo"
    assert harness.engine.generates() == []
    assert "Ctrl+Enter" in edit.placeholderText()
    qtbot.keyClick(edit, Qt.Key.Key_Return, CTRL)
    harness.wait_idle()
    assert harness.texts() == ["one\ntwo", "Echo: one\ntwo"]

    window = harness.open()  # the setting is saved
    edit = window.composer.edit
    type_text(qtbot, edit, "three")
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    assert edit.toPlainText() == "three\n"
    choose_in_settings(window, qtbot, "Enter sends")
    qtbot.keyClick(edit, Qt.Key.Key_Backspace)
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    harness.wait_idle()
    assert harness.texts()[-2:] == ["three", "Echo: three"]


class _Paints(QObject):
    """Counts the paint events a widget gets."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def eventFilter(self, _obj, event) -> bool:  # noqa: N802 - Qt's name
        if event.type() == QEvent.Type.Paint:
            self.count += 1
        return False


def test_a_new_placeholder_is_painted_at_once(harness, qtbot):
    """The empty box's hint changes with the model (plain completion) and the send key:
    the box is painted again then, not left showing the old hint until it is next touched
    (Qt repaints a placeholder only when it appears or goes)."""
    window = harness.open()
    edit = window.composer.edit
    qtbot.waitExposed(window)
    paints = _Paints()
    window.sidebar.search.setFocus()  # no blinking cursor in the box to paint it anyway
    edit.viewport().installEventFilter(paints)
    qtbot.wait(300)  # the window's first paints are done
    for change in (
        lambda: edit.set_plain_completion(True),
        lambda: edit.set_send_key("ctrl_enter"),
    ):
        before, text = paints.count, edit.placeholderText()
        change()
        assert edit.placeholderText() != text
        qtbot.waitUntil(lambda before=before: paints.count > before, timeout=2000)
