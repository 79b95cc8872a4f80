"""The main window against the FakeEngine: what a person does, and what they then see."""

from __future__ import annotations

import itertools
import json

from PySide6.QtCore import Qt

from engine.events import Message, Stop


def click_action(harness, qtbot, row: int, name: str) -> None:
    """Click the painted button `name` ("Edit", "prev", ...) on message `row`."""
    window = harness.window
    view = window.chat.list_view
    index = window.controller.model.index(row)
    view.scrollTo(index)
    qtbot.wait(10)
    geometry, _ = view.delegate.geometry(view.visualRect(index), index)
    rects = dict(geometry.actions)
    rects.update(prev=geometry.nav_prev, next=geometry.nav_next)
    rect = rects[name]
    assert rect is not None, f"no {name} on row {row}"
    assert view.viewport().rect().contains(rect.center()), "the button is off screen"
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def edit_row(harness, qtbot, row: int, text: str) -> None:
    click_action(harness, qtbot, row, "Edit")
    editor = harness.window.chat.editor()
    assert editor is not None
    editor.text_edit.setPlainText(text)
    editor.save_button.click()


def test_send_streams_the_reply_token_by_token(harness, qtbot):
    window = harness.open()
    harness.engine.token_delay = 0.03
    seen: list[str] = []
    model = window.controller.model
    model.dataChanged.connect(lambda top, _b, _r=(): seen.append(model.item(top.row()).content))
    harness.send("Hello there, how are you today?")
    assert harness.texts() == [
        "Hello there, how are you today?",
        "Echo: Hello there, how are you today?",
    ]
    reply = harness.items()[1]
    assert reply.status == "done" and reply.stats["generated_tokens"] == 7
    partials = {text for text in seen if text and text != reply.content}
    assert len(partials) >= 2, "the reply should appear in pieces while it streams"
    rendered = window.chat.delegate.rendered(reply, window.chat.list_view.viewport().width())
    assert rendered.markdown.doc.toPlainText() == reply.content
    assert "tok/s" in window.composer.status.text()
    assert window.composer.edit.toPlainText() == "" and window.composer.send_button.text() == "Send"
    assert [r.title for r in window.sidebar.model._rows if r.kind == "conversation"] == [
        "Hello there, how are you today?"
    ]


def test_edit_a_middle_user_message_makes_a_branch(harness, qtbot):
    harness.open()
    for text in ("first", "second", "third"):
        harness.send(text)
    edit_row(harness, qtbot, 2, "second, edited")
    harness.wait_idle()
    assert harness.texts() == ["first", "Echo: first", "second, edited", "Echo: second, edited"]
    edited = harness.items()[2]
    assert (edited.sibling_index, edited.sibling_count) == (2, 2)

    click_action(harness, qtbot, 2, "prev")
    qtbot.waitUntil(lambda: harness.texts()[2] == "second")
    assert harness.texts() == [
        "first",
        "Echo: first",
        "second",
        "Echo: second",
        "third",
        "Echo: third",
    ]
    assert (harness.items()[2].sibling_index, harness.items()[2].sibling_count) == (1, 2)
    click_action(harness, qtbot, 2, "next")
    qtbot.waitUntil(lambda: harness.texts()[2] == "second, edited")
    assert len(harness.texts()) == 4


def test_regenerate_makes_a_sibling_reply(harness, qtbot):
    counter = itertools.count(1)
    harness.open(
        engine_factory=lambda listener: _fake(
            harness, listener, lambda c: f"Answer {next(counter)}"
        )
    )
    harness.send("question")
    assert harness.texts() == ["question", "Answer 1"]
    click_action(harness, qtbot, 1, "Regenerate")
    harness.wait_idle()
    assert harness.texts() == ["question", "Answer 2"]
    reply = harness.items()[1]
    assert (reply.sibling_index, reply.sibling_count) == (2, 2)
    generate = harness.engine.generates()[-1]
    assert generate.messages == (Message("user", "question"),)
    click_action(harness, qtbot, 1, "prev")
    qtbot.waitUntil(lambda: harness.texts() == ["question", "Answer 1"])


def test_stop_keeps_the_partial_reply_and_continue_appends(harness, qtbot):
    window = harness.open()
    harness.engine.pause_after = 2
    harness.send("tell me a long story please", wait=False)
    qtbot.waitUntil(lambda: harness.texts()[-1] == "Echo: tell")
    assert window.composer.send_button.text() == "Stop"
    window.activateWindow()
    window.composer.edit.setFocus()
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Escape)
    harness.wait_idle()
    assert any(isinstance(c, Stop) for c in harness.engine.commands)
    stopped = harness.items()[-1]
    assert (stopped.content, stopped.status) == ("Echo: tell", "stopped")

    harness.engine.resume()
    click_action(harness, qtbot, 1, "Continue")
    harness.wait_idle()
    assert harness.texts()[-1] == "Echo: tell and that is the rest."
    assert harness.items()[-1].status == "done"
    assert harness.items()[-1].sibling_count == 1, "continuing appends to the same message"
    generate = harness.engine.generates()[-1]
    assert generate.settings.continue_last
    assert generate.messages[-1] == Message("assistant", "Echo: tell")


def test_the_tree_survives_a_restart(harness, qtbot):
    harness.open()
    harness.send("one")
    harness.send("two")
    edit_row(harness, qtbot, 2, "two, take two")
    harness.wait_idle()
    click_action(harness, qtbot, 2, "prev")
    qtbot.waitUntil(lambda: harness.texts()[2] == "two")
    before = [(i.content, i.sibling_index, i.sibling_count) for i in harness.items()]

    window = harness.open()  # a new window over the same database file
    assert harness.texts() == []
    row = window.sidebar.model.row_of(window.store.list_conversations()[0].id)
    window.sidebar.list.clicked.emit(window.sidebar.model.index(row))
    after = [(i.content, i.sibling_index, i.sibling_count) for i in harness.items()]
    assert after == before


def test_search_finds_a_message_in_another_branch(harness, qtbot):
    window = harness.open()
    harness.send("tell me about lighthouses")
    edit_row(harness, qtbot, 0, "tell me about harbours")
    harness.wait_idle()
    harness.send("and about ships")
    harness.window.new_chat()
    assert harness.texts() == []
    qtbot.keyClicks(window.sidebar.search, "LIGHTHOUSE")
    hits = lambda: [r for r in window.sidebar.model._rows if r.kind == "hit"]  # noqa: E731
    qtbot.waitUntil(lambda: len(hits()) == 2)  # the question and its echo
    user_hit = next(h for h in hits() if "Echo" not in h.snippet)
    row = window.sidebar.model._rows.index(user_hit)
    window.sidebar.list.clicked.emit(window.sidebar.model.index(row))
    assert harness.texts() == ["tell me about lighthouses", "Echo: tell me about lighthouses"]
    window.sidebar.search.clear()
    qtbot.waitUntil(lambda: not hits())


def test_export_and_import_round_trip(harness, qtbot, tmp_path):
    window = harness.open()
    harness.send("alpha")
    edit_row(harness, qtbot, 0, "beta")
    harness.wait_idle()
    first = window.controller.conversation_id
    window.conversation_files.export_conversation(first, "json", tmp_path / "a.json")
    window.conversation_files.export_conversation(first, "markdown", tmp_path / "a.md")
    assert "## You\n\nbeta" in (tmp_path / "a.md").read_text()

    imported = window.conversation_files.import_conversation(tmp_path / "a.json")
    assert imported not in (None, first)
    assert window.controller.conversation_id == imported
    assert harness.texts() == ["beta", "Echo: beta"]
    window.conversation_files.export_conversation(imported, "json", tmp_path / "b.json")
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert _without_ids(a) == _without_ids(b)


def test_an_engine_failure_shows_a_dismissable_banner(harness, qtbot):
    window = harness.open()
    harness.engine.fail_next = ("The model ran out of memory.", "Traceback: MemoryError")
    harness.send("hi")
    banner = window.banner
    assert banner.isVisible() and banner.message.text() == "The model ran out of memory."
    assert banner.details_button.isVisible() and not banner.details.isVisible()
    banner.details_button.click()
    assert banner.details.isVisible() and "MemoryError" in banner.details.text()
    banner.dismiss_button.click()
    assert not banner.isVisible()
    assert harness.texts() == ["hi"], "the empty reply placeholder is dropped, the question kept"
    assert window.composer.send_button.text() == "Send"
    click_action(harness, qtbot, 0, "Retry")
    harness.wait_idle()
    assert harness.texts() == ["hi", "Echo: hi"]


def test_delete_can_be_undone(harness, qtbot):
    window = harness.open()
    harness.send("keep me")
    conversation = window.controller.conversation_id
    window.delete_conversation(conversation)
    assert window.store.list_conversations() == [] and harness.texts() == []
    assert "Deleted" in window.banner.message.text()
    window.banner.action_button.click()
    assert [c.id for c in window.store.list_conversations()] == [conversation]
    assert harness.texts() == ["keep me", "Echo: keep me"]


def test_up_edits_the_last_user_message_and_escape_cancels(harness, qtbot):
    window = harness.open()
    harness.send("first")
    harness.send("second")
    window.composer.edit.setFocus()
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Up)
    editor = window.chat.editor()
    assert editor is not None and editor.text == "second"
    assert window.chat.editing_id == harness.items()[2].id
    editor.text_edit.setPlainText("changed my mind")
    qtbot.keyClick(editor.text_edit, Qt.Key.Key_Escape)
    assert window.chat.editor() is None and window.chat.editing_id is None
    assert harness.texts() == ["first", "Echo: first", "second", "Echo: second"]
    assert len(harness.engine.generates()) == 2


def test_editing_a_reply_saves_a_sibling_without_generating(harness, qtbot):
    harness.open()
    harness.send("question")
    edit_row(harness, qtbot, 1, "A better answer, by hand")
    assert harness.texts() == ["question", "A better answer, by hand"]
    reply = harness.items()[1]
    assert (reply.status, reply.sibling_index, reply.sibling_count) == ("edited", 2, 2)
    assert len(harness.engine.generates()) == 1


def test_ctrl_enter_sends_and_model_and_settings_persist(harness, qtbot):
    window = harness.open()
    window.model_loader.load("/models/fake.gguf")
    qtbot.waitUntil(lambda: window.header.name.text() == "Fake-1M")
    assert "llama" in window.header.info.text() and "2k ctx" in window.header.info.text()
    window.composer.edit.setPlainText("via keyboard")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    harness.wait_idle()
    assert harness.texts() == ["via keyboard", "Echo: via keyboard"]
    from dataclasses import replace

    window.apply_settings(replace(window.settings, temperature=0.25, system_prompt="Be brief."))
    harness.send("again")
    generate = harness.engine.generates()[-1]
    assert generate.settings.sampling.temperature == 0.25
    assert generate.messages[0] == Message("system", "Be brief.")
    window = harness.open()
    assert window.settings.temperature == 0.25
    assert window.settings.recent_models == ("/models/fake.gguf",)


def _fake(harness, listener, reply):
    from tests.app.fake_engine import FakeEngine

    harness.engine = FakeEngine(listener, reply)
    return harness.engine


def _without_ids(export: dict) -> dict:
    """The tree's shape and content, with ids replaced by their order of appearance."""
    order = {m["id"]: n for n, m in enumerate(export["messages"])}
    messages = [
        {**m, "id": order[m["id"]], "parent_id": order.get(m["parent_id"]),
         "selected_child": order.get(m["selected_child"])}
        for m in export["messages"]
    ]  # fmt: skip
    return {**export, "selected_root": order.get(export["selected_root"]), "messages": messages}


def _disk_full(*_args, **_kwargs):
    import sqlite3

    raise sqlite3.OperationalError("database or disk is full")


def test_a_full_disk_keeps_the_message_in_the_box_and_says_why(harness, qtbot, monkeypatch):
    window = harness.open()
    harness.send("first question")
    monkeypatch.setattr(window.store, "add_message", _disk_full)
    harness.send("second question", wait=False)
    assert window.banner.isVisible() and "disk is full" in window.banner.message.text()
    assert window.composer.edit.toPlainText() == "second question"
    assert not window.controller.is_busy
    assert harness.texts() == ["first question", "Echo: first question"]
    monkeypatch.undo()
    window.composer.send_button.click()
    harness.wait_idle()
    assert harness.texts()[-2:] == ["second question", "Echo: second question"]


def test_a_reply_the_store_cannot_take_stays_on_screen(harness, qtbot, monkeypatch):
    window = harness.open()
    update = window.store.update_message

    def refuse_the_final_save(message_id, **fields):
        if fields.get("status") == "done":
            _disk_full()
        return update(message_id, **fields)

    monkeypatch.setattr(window.store, "update_message", refuse_the_final_save)
    harness.send("hello")
    assert not window.controller.is_busy  # the request ended although the save failed
    assert harness.texts() == ["hello", "Echo: hello"]
    assert "Could not save the reply" in window.banner.message.text()


def test_an_edit_the_store_cannot_take_goes_back_in_the_editor(harness, qtbot, monkeypatch):
    window = harness.open()
    harness.send("original")
    monkeypatch.setattr(window.store, "add_message", _disk_full)
    edit_row(harness, qtbot, 0, "changed")
    editor = window.chat.editor()
    assert editor is not None and editor.text_edit.toPlainText() == "changed"
    assert "disk is full" in window.banner.message.text()
    assert harness.texts() == ["original", "Echo: original"]


def test_rename_and_delete_report_a_refused_write(harness, qtbot, monkeypatch):
    window = harness.open()
    harness.send("keep me")
    cid = window.controller.conversation_id
    monkeypatch.setattr(window.store, "rename_conversation", _disk_full)
    monkeypatch.setattr(window.store, "delete_conversation", _disk_full)
    window._rename(cid, "new title")
    assert "Could not rename" in window.banner.message.text()
    window.delete_conversation(cid)
    assert "Could not delete" in window.banner.message.text()
    assert window.store.get_conversation(cid) is not None
    assert harness.texts() == ["keep me", "Echo: keep me"]


def test_a_narrow_window_wraps_the_status_line_and_keeps_it_whole(harness, qtbot):
    window = harness.open()
    harness.send("Hello there, how are you today?")
    status = window.composer.status
    line = status.text()
    assert "tok/s" in line
    window.resize(520, 700)  # narrower than the line
    qtbot.waitUntil(lambda: status.width() < status.fontMetrics().horizontalAdvance(line))
    assert status.geometry().right() <= window.composer.width()
    two_lines = 2 * status.fontMetrics().lineSpacing()
    qtbot.waitUntil(lambda: status.height() >= two_lines)  # the layout gave it the room
    assert status.text() == line  # all of it, on two lines


def test_an_edit_saves_with_the_key_that_sends(harness, qtbot):
    """Enter saves an edited message, as it sends one, and Shift+Enter makes a new line in
    it; with Settings' Ctrl+Enter, Enter makes the new line and Ctrl+Enter saves."""
    window = harness.open()
    harness.send("first")
    click_action(harness, qtbot, 0, "Edit")
    editor = window.chat.editor()
    editor.text_edit.setPlainText("one")
    editor.focus_end()
    qtbot.keyClick(editor.text_edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(editor.text_edit, "two")
    assert editor.text == "one\ntwo" and window.chat.editor() is editor
    qtbot.keyClick(editor.text_edit, Qt.Key.Key_Return)
    harness.wait_idle()
    assert harness.texts() == ["one\ntwo", "Echo: one\ntwo"] and window.chat.editor() is None
    from dataclasses import replace

    window.apply_settings(replace(window.settings, send_key="ctrl_enter"))
    click_action(harness, qtbot, 0, "Edit")
    editor = window.chat.editor()
    editor.text_edit.setPlainText("three")
    editor.focus_end()
    qtbot.keyClick(editor.text_edit, Qt.Key.Key_Return)
    qtbot.keyClicks(editor.text_edit, "four")
    assert editor.text == "three\nfour" and window.chat.editor() is editor
    qtbot.keyClick(editor.text_edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    harness.wait_idle()
    assert harness.texts() == ["three\nfour", "Echo: three\nfour"]
    assert [g.messages[-1].content for g in harness.engine.generates()] == [
        "first", "one\ntwo", "three\nfour"
    ]  # fmt: skip
