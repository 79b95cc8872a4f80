"""Per-chat settings used the way a person does: click the header's chat button, type in the
dialog, pick a preset, press OK; the next Generate carries them, and they are still there
after the app is reopened over the same files."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QDialogButtonBox, QInputDialog

from app.conversation.chat_settings import ChatSettings, PresetLibrary
from engine.events import Generate


def in_dialog(window, qtbot, act, ok: bool = True) -> None:
    """Click the chat button; once the (modal) dialog is up, `act(dialog)`, then OK."""
    done: list[bool] = []

    def drive() -> None:
        dialog = window.chat_settings.dialog
        if dialog is None or not dialog.isVisible():
            QTimer.singleShot(10, drive)
            return
        act(dialog)
        which = QDialogButtonBox.StandardButton.Ok if ok else QDialogButtonBox.StandardButton.Cancel
        qtbot.mouseClick(dialog.buttons.button(which), Qt.MouseButton.LeftButton)
        done.append(True)

    QTimer.singleShot(0, drive)
    qtbot.mouseClick(window.header.chat_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(done) and window.chat_settings.dialog is None)


def type_into(qtbot, box, text: str) -> None:
    box.setFocus()
    box.selectAll()
    qtbot.keyClicks(box, text)


def last_generate(harness) -> Generate:
    return harness.engine.generates()[-1]


def open_first_chat(window) -> None:
    row = window.sidebar.model.row_of(window.store.list_conversations()[0].id)
    window.sidebar.list.clicked.emit(window.sidebar.model.index(row))


def test_temperature_and_system_prompt_reach_the_engine_and_survive_a_restart(harness, qtbot):
    window = harness.open()
    harness.send("first")  # a chat that exists, on the app's defaults
    assert last_generate(harness).settings.sampling.temperature == 0.7
    assert window.header.chat_button.text() == "Chat: App defaults"

    def tune(dialog) -> None:
        dialog.system_prompt.setFocus()
        qtbot.keyClicks(dialog.system_prompt, "Answer like a pirate.")
        type_into(qtbot, dialog.temperature, "1.35")
        type_into(qtbot, dialog.seed, "42")
        type_into(qtbot, dialog.context_length, "1500")
        qtbot.mouseClick(dialog.thinking, Qt.MouseButton.LeftButton)  # thinking off

    in_dialog(window, qtbot, tune)
    assert window.header.chat_button.text() == "Chat: Custom · system prompt · no thinking"
    harness.send("second")
    generate = last_generate(harness)
    assert generate.messages[0].role == "system"
    assert generate.messages[0].content == "Answer like a pirate."
    sampling = generate.settings.sampling
    assert (sampling.temperature, sampling.seed) == (1.35, 42)
    assert generate.settings.context_length == 1500
    assert generate.settings.enable_thinking is False

    window = harness.open()  # a new window and store over the same files
    open_first_chat(window)
    harness.send("third")
    again = last_generate(harness)
    assert again.messages[0].content == "Answer like a pirate."
    assert again.settings.sampling.temperature == 1.35 and again.settings.context_length == 1500
    saved = window.store.get_conversation_settings(window.controller.conversation_id)
    assert saved["system_prompt"] == "Answer like a pirate." and saved["thinking"] is False


def test_a_preset_sets_the_sampling_and_a_saved_preset_is_offered_after_a_restart(
    harness, qtbot, monkeypatch
):
    window = harness.open()

    def pick_precise(dialog) -> None:
        dialog.preset.setCurrentText("Precise")
        dialog.preset.activated.emit(dialog.preset.currentIndex())  # what a pick sends

    in_dialog(window, qtbot, pick_precise)  # on a chat not created yet
    assert window.header.chat_button.text() == "Chat: Precise"
    harness.send("hello")  # the first message creates the chat with those settings
    sampling = last_generate(harness).settings.sampling
    assert (sampling.temperature, sampling.top_k, sampling.min_p) == (0.0, 0, 0.0)

    monkeypatch.setattr(QInputDialog, "getText", lambda *_a, **_k: ("My sharp one", True))

    def save_mine(dialog) -> None:
        type_into(qtbot, dialog.top_k, "7")
        assert dialog.preset.currentText() == "Custom"  # edited: no longer Precise
        qtbot.mouseClick(dialog.save_preset, Qt.MouseButton.LeftButton)
        assert dialog.preset.currentText() == "My sharp one"

    in_dialog(window, qtbot, save_mine)
    harness.send("again")
    assert last_generate(harness).settings.sampling.top_k == 7

    window = harness.open()
    names = [p.name for p in window.chat_settings.presets.presets()]
    assert names == ["Precise", "Balanced", "Creative", "My sharp one"]
    open_first_chat(window)
    assert window.header.chat_button.text() == "Chat: My sharp one"

    def delete_mine(dialog) -> None:
        assert dialog.preset.currentText() == "My sharp one"
        qtbot.mouseClick(dialog.delete_preset, Qt.MouseButton.LeftButton)

    in_dialog(window, qtbot, delete_mine)
    assert [p.name for p in PresetLibrary(window.chat_settings.presets.path).presets()] == [
        "Precise",
        "Balanced",
        "Creative",
    ]


def test_cancel_changes_nothing_and_another_chat_keeps_the_defaults(harness, qtbot):
    window = harness.open()
    harness.send("tuned chat")
    in_dialog(window, qtbot, lambda d: type_into(qtbot, d.temperature, "1.9"), ok=False)
    harness.send("still default")
    assert last_generate(harness).settings.sampling.temperature == 0.7
    in_dialog(window, qtbot, lambda d: type_into(qtbot, d.temperature, "1.9"))
    window.new_chat()
    harness.send("a fresh chat")
    generate = last_generate(harness)
    assert generate.settings.sampling.temperature == 0.7
    assert [m.role for m in generate.messages] == ["user"]


def test_settings_saved_by_another_version_load_what_they_can():
    base = ChatSettings(temperature=0.5)
    loaded = ChatSettings.from_dict(
        {"temperature": "hot", "top_k": 12, "seed": None, "unknown": 1, "top_p": 7.0}, base
    )
    assert (loaded.temperature, loaded.top_k, loaded.top_p) == (0.5, 12, 0.95)


def test_settings_that_make_no_sense_are_refused_in_the_dialog_and_nothing_is_saved(harness, qtbot):
    window = harness.open()
    harness.send("a chat")
    seen: list[str] = []

    def too_small(dialog) -> None:
        type_into(qtbot, dialog.context_length, "1")
        qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Ok),
                         Qt.MouseButton.LeftButton)  # fmt: skip
        seen.append(dialog.error.text())
        assert dialog.isVisible()  # still open, the typed value there to correct

    in_dialog(window, qtbot, too_small, ok=False)
    assert seen == ["context length must be >= 2 tokens (or the model's)"]
    assert window.store.get_conversation_settings(window.controller.conversation_id) == {}
