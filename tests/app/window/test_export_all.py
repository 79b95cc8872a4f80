"""File ▸ Export all chats as JSON: one file holding every chat with its branches (a
backup), which File ▸ Import reads back whole; greyed with no chat; a file that cannot be
written is a banner, not a lost click."""

from __future__ import annotations

import json

from PySide6.QtWidgets import QFileDialog

from tests.app.window.test_window import edit_row
from tests.app.window.test_window_habits import menu_action


def shapes(store, conversation_id):
    tree = store.load_tree(conversation_id)

    def walk(parent):
        return [(n.role, n.content, walk(n.id)) for n in tree.children(parent)]

    return walk(None), [n.content for n in tree.selected_path()]


def test_every_chat_goes_into_one_file_and_comes_back_whole(harness, qtbot, monkeypatch, tmp_path):
    window = harness.open()
    harness.send("Lisbon trip")
    edit_row(harness, qtbot, 0, "Porto trip")  # a second branch in the first chat
    harness.wait_idle()
    window.new_chat()
    harness.send("a second chat")
    before = {
        c.id: (c.title, shapes(harness.store, c.id)) for c in harness.store.list_conversations()
    }
    asked = []
    target = tmp_path / "backup.json"

    def save_dialog(_parent, caption, suggested, _filter):
        asked.append((caption, suggested))
        return str(target), "JSON (*.json)"

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_dialog)
    file_menu = menu_action(window, "File", "Export all chats").parent()
    file_menu.aboutToShow.emit()
    assert menu_action(window, "File", "Export all chats").isEnabled()
    menu_action(window, "File", "Export all chats").trigger()
    assert asked[0][0] == "Export all chats" and asked[0][1].endswith(".json")
    assert "branchchat-chats-" in asked[0][1]
    data = json.loads(target.read_text(encoding="utf-8"))
    assert [c["title"] for c in data["conversations"]] == ["a second chat", "Lisbon trip"]
    assert window.banner.message.text() == "Exported 2 chats to backup.json."

    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *_a, **_k: (str(target), "JSON"))
    menu_action(window, "File", "Import chats").trigger()
    added = [c for c in harness.store.list_conversations() if c.id not in before]
    assert sorted((c.title, shapes(harness.store, c.id)) for c in added) == sorted(
        before.values()
    )  # both chats, every branch, the branch on screen
    assert window.controller.conversation_id in {c.id for c in added}


def test_export_all_is_greyed_without_chats_and_a_failed_write_says_so(
    harness, qtbot, monkeypatch, tmp_path
):
    window = harness.open()
    action = menu_action(window, "File", "Export all chats")
    action.parent().aboutToShow.emit()
    assert not action.isEnabled()
    harness.send("something to keep")
    action.parent().aboutToShow.emit()
    assert action.isEnabled()
    nowhere = tmp_path / "no such folder" / "backup.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *_a: (str(nowhere), "JSON"))
    action.trigger()
    assert window.banner.message.text() == "Could not export to backup.json."
    assert not nowhere.exists() and len(harness.store.list_conversations()) == 1
    window.banner.dismiss_button.click()
    assert not window.banner.isVisible()
    menu_action(window, "File", "Export chat as JSON").trigger()  # one chat: the same banner
    assert window.banner.isVisible()
    assert window.banner.message.text() == "Could not export to backup.json."
