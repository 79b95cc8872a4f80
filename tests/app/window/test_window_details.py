"""Smaller window behaviours: copy buttons, the Stop button, partial saves while
streaming, rename, settings dialog, model-load failure, theme switch."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication

from app.settings.settings_dialog import SettingsDialog
from app.theme import DARK
from engine.events import Failed
from tests.app.window.test_window import click_action

CODE_REPLY = "Here:\n\n```python\nprint('hi')\n```\n\nDone."


def test_copy_buttons_copy_the_message_and_the_code(harness, qtbot):
    window = harness.open()
    harness.engine.reply = lambda _command: CODE_REPLY
    harness.send("code please")
    click_action(harness, qtbot, 1, "Copy")
    assert QGuiApplication.clipboard().text() == CODE_REPLY

    view = window.chat.list_view
    index = window.controller.model.index(1)
    geometry, rendered = view.delegate.geometry(view.visualRect(index), index)
    copy_rect = view.delegate._copy_rect(geometry, rendered.code_rects[0])
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=copy_rect.center().toPoint())
    assert QGuiApplication.clipboard().text() == "print('hi')"


def test_the_stop_button_stops_and_partial_text_is_saved_while_streaming(harness, qtbot):
    window = harness.open()
    window.controller._save_timer.setInterval(30)  # the 2 s cadence, made quick
    harness.engine.pause_after = 3
    harness.send("one two three four five", wait=False)
    qtbot.waitUntil(lambda: harness.texts()[-1] == "Echo: one two")
    reply_id = harness.items()[-1].id
    store = window.store
    conversation = window.controller.conversation_id
    qtbot.waitUntil(lambda: store.load_tree(conversation).node(reply_id).content == "Echo: one two")
    assert store.load_tree(conversation).node(reply_id).status == "streaming"

    assert window.composer.send_button.text() == "Stop"
    window.composer.send_button.click()
    harness.wait_idle()
    node = store.load_tree(conversation).node(reply_id)
    assert (node.content, node.status) == ("Echo: one two", "stopped")


def test_rename_from_the_sidebar_is_stored(harness, qtbot):
    window = harness.open()
    harness.send("a question")
    conversation = window.controller.conversation_id
    sidebar = window.sidebar
    index = sidebar.model.index(sidebar.model.row_of(conversation))
    assert sidebar.model.setData(index, "Renamed chat")
    assert window.store.get_conversation(conversation).title == "Renamed chat"
    assert sidebar.model.row(sidebar.model.row_of(conversation)).title == "Renamed chat"


def test_the_settings_dialog_round_trips(harness, qtbot):
    window = harness.open()
    dialog = SettingsDialog(window.settings, window)
    qtbot.addWidget(dialog)
    assert dialog.result_settings() == window.settings
    dialog.temperature.setValue(1.3)
    dialog.drafter.setCurrentIndex(dialog.drafter.findData("lookup"))
    dialog.tint_drafted.setChecked(True)
    result = dialog.result_settings()
    assert (result.temperature, result.drafter, result.tint_drafted) == (1.3, "lookup", True)
    dialog.drafter.setCurrentIndex(dialog.drafter.findText("Block drafter + prompt lookup"))
    assert dialog.result_settings().drafter == "block"


def test_a_model_that_fails_to_load_shows_the_banner(harness, qtbot):
    window = harness.open()
    window.bridge._listen(Failed("", "model.gguf: not a GGUF file", "bad magic"))
    qtbot.waitUntil(window.banner.isVisible)
    assert window.banner.message.text() == "model.gguf: not a GGUF file"
    assert window.header.name.text() == "No model loaded"
    window.banner.dismiss_button.click()
    assert not window.banner.isVisible()


def test_switching_to_the_dark_theme_repaints_with_it(harness, qtbot):
    window = harness.open()
    harness.send("hello")
    window.set_theme(DARK)
    assert window.chat.delegate.theme is DARK
    qtbot.wait(20)
    item = harness.items()[1]
    rendered = window.chat.delegate.rendered(item, window.chat.list_view.viewport().width())
    assert rendered.key[-1] == "dark"
    QApplication.instance().setStyleSheet("")  # the style sheet is application-wide
