"""The sidebar as a person uses it: chats appear with their titles under date headings,
a rename made with F2 shows at once and is saved, chats imported from ChatGPT or
Open WebUI through the sidebar's menu are listed with their own titles and dates, and a
search hit shows its match in bold, kept in view in a narrow sidebar, and a branch copy's
"(branch)" stays in view where its title is cut."""

from __future__ import annotations

import json
import time

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QFontMetrics, QImage, QPainter
from PySide6.QtWidgets import QFileDialog, QStyle, QStyleOptionViewItem

from app.sidebar.conversation_delegate import hit_line, title_line
from tests.app.conversation.test_import_formats import chatgpt_export, open_webui_export


def rows(window) -> list[tuple[str, str]]:
    model = window.sidebar.model
    return [(model.row(i).kind, model.row(i).title) for i in range(model.rowCount())]


def import_through_the_menu(window, qtbot, monkeypatch, path) -> None:
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *_a, **_k: (str(path), "JSON"))
    window.sidebar.import_action.trigger()


def test_imported_chatgpt_chats_are_listed_under_their_dates_and_the_newest_opens(
    harness, qtbot, monkeypatch, tmp_path
):
    window = harness.open()
    harness.send("today's question")
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(chatgpt_export(), ensure_ascii=False), encoding="utf-8")
    import_through_the_menu(window, qtbot, monkeypatch, path)
    assert rows(window) == [
        ("header", "Today"),
        ("conversation", "today's question"),
        ("header", "Older"),  # ChatGPT's own update times, from 1970 in this file
        ("conversation", "Heure — 時間"),
        ("conversation", "Older chat"),
    ]
    current = window.sidebar.list.currentIndex().row()
    assert rows(window)[current] == ("conversation", "Heure — 時間")
    assert harness.texts()[-2:] == ["Output:\n```\n1024\n```", "1024"]
    assert window.banner.isHidden()


def test_an_open_webui_export_shows_its_title_and_its_system_prompt_is_the_chats(
    harness, qtbot, monkeypatch, tmp_path
):
    window = harness.open()
    path = tmp_path / "export.json"
    export = open_webui_export()
    export[0]["updated_at"] = time.time()
    path.write_text(json.dumps(export, ensure_ascii=False), encoding="utf-8")
    import_through_the_menu(window, qtbot, monkeypatch, path)
    assert rows(window) == [("header", "Today"), ("conversation", "Haïku")]
    assert window.header.chat_button.text() == "Chat: App defaults · system prompt"
    harness.send("Encore un")
    generate = harness.engine.generates()[-1]
    assert generate.messages[0].content == "Réponds en français."


def test_a_file_of_another_kind_is_refused_in_the_banner(harness, qtbot, monkeypatch, tmp_path):
    window = harness.open()
    path = tmp_path / "notes.json"
    path.write_text('{"notes": []}', encoding="utf-8")
    import_through_the_menu(window, qtbot, monkeypatch, path)
    assert not window.banner.isHidden()
    assert window.banner.message.text() == "Could not import notes.json."
    assert "ChatGPT's conversations.json" in window.banner.details.text()
    assert rows(window) == []


def test_the_first_message_titles_a_new_chat_and_f2_renames_it(harness, qtbot):
    window = harness.open()
    harness.send("How   do tides\nwork?")
    assert rows(window) == [("header", "Today"), ("conversation", "How do tides work?")]
    view = window.sidebar.list
    view.setFocus()
    view.setCurrentIndex(window.sidebar.model.index(1))
    qtbot.keyClick(view, Qt.Key.Key_F2)
    editor = view.focusWidget()
    editor.selectAll()
    qtbot.keyClicks(editor, "Tides")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: rows(window)[1] == ("conversation", "Tides"))
    assert window.store.get_conversation(window.controller.conversation_id).title == "Tides"
    window = harness.open()
    assert rows(window) == [("header", "Today"), ("conversation", "Tides")]


def test_a_search_hit_shows_its_match_kept_in_view(harness, qtbot):
    """The match's place comes with each hit (any case); in a line too short for the
    snippet the match stays whole, the text before it elided at its left."""
    window = harness.open()
    words = "an opening that runs on and on about nothing in particular before the word "
    harness.send(words + "Lighthouse and after it some more")
    qtbot.keyClicks(window.sidebar.search, "LIGHTHOUSE")
    hits = lambda: [r for r in window.sidebar.model._rows if r.kind == "hit"]  # noqa: E731
    qtbot.waitUntil(lambda: len(hits()) == 2)  # the message and its echo
    for hit in hits():
        start, end = hit.match
        assert hit.snippet[start:end] == "Lighthouse", (hit.snippet, hit.match)
    hit = hits()[0]
    font = QFont(window.sidebar.list.font())
    bold = QFont(font)
    bold.setWeight(QFont.Weight.Bold)
    plain, strong = QFontMetrics(font), QFontMetrics(bold)
    whole = hit_line(hit, plain, strong, 10_000)
    assert "".join(whole) == hit.snippet and whole[1] == "Lighthouse"
    width = strong.horizontalAdvance("Lighthouse") + plain.horizontalAdvance("word and after")
    before, match, after = hit_line(hit, plain, strong, width)
    assert match == "Lighthouse" and before.startswith("…") and after
    used = plain.horizontalAdvance(before) + strong.horizontalAdvance(match)
    assert used + plain.horizontalAdvance(after) <= width
    assert hit_line(hit, plain, strong, 30)[1].endswith("…")  # the match alone too wide


def test_the_chat_list_from_the_keyboard_enter_opens_and_delete_deletes(harness, qtbot):
    """Arrow to a chat and press Enter: it opens. Delete: it goes, with Undo in the banner.
    Delete in a title being renamed edits the title instead; on a search hit it does
    nothing."""
    window = harness.open()
    harness.send("first chat")
    first = window.controller.conversation_id
    window.new_chat()
    harness.send("second chat")
    assert rows(window) == [("header", "Today"), ("conversation", "second chat"),
                            ("conversation", "first chat")]  # fmt: skip
    view = window.sidebar.list
    view.setFocus()
    view.setCurrentIndex(window.sidebar.model.index(1))
    qtbot.keyClick(view, Qt.Key.Key_Down)
    qtbot.keyClick(view, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.controller.conversation_id == first)
    assert harness.texts() == ["first chat", "Echo: first chat"]

    qtbot.keyClick(view, Qt.Key.Key_F2)
    editor = view.focusWidget()
    qtbot.keyClick(editor, Qt.Key.Key_End)
    qtbot.keyClick(editor, Qt.Key.Key_Backspace)
    qtbot.keyClick(editor, Qt.Key.Key_Home)
    qtbot.keyClick(editor, Qt.Key.Key_Delete)
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: rows(window)[2] == ("conversation", "irst cha"))

    view.setFocus()
    view.setCurrentIndex(window.sidebar.model.index(2))
    qtbot.keyClick(view, Qt.Key.Key_Delete)
    qtbot.waitUntil(lambda: rows(window) == [("header", "Today"), ("conversation", "second chat")])
    assert [c.id for c in window.store.list_conversations()] != [first]
    assert window.banner.message.text() == "Deleted “irst cha”."
    window.banner.action_button.click()
    assert first in [c.id for c in window.store.list_conversations()]
    assert window.controller.conversation_id == first  # Undo opened it again
    qtbot.keyClicks(window.sidebar.search, "chat")
    qtbot.waitUntil(lambda: rows(window)[0] == ("header", "4 results"))
    view.setFocus()
    view.setCurrentIndex(window.sidebar.model.index(1))
    qtbot.keyClick(view, Qt.Key.Key_Delete)  # on a search hit (a message): nothing
    assert len(window.store.list_conversations()) == 2


class _TextsPainter(QPainter):
    """A painter that keeps every text the delegate draws (the delegate calls it from Python)."""

    def __init__(self, device) -> None:
        super().__init__(device)
        self.texts: list[str] = []

    def drawText(self, *args) -> None:  # noqa: N802 (Qt's name)
        self.texts.append(args[-1])
        super().drawText(*args)


def painted_titles(window) -> dict[str, str]:
    """Each chat row's title as the sidebar's delegate paints it at the list's own width."""
    view, model = window.sidebar.list, window.sidebar.model
    out = {}
    for i in range(model.rowCount()):
        if model.row(i).kind != "conversation":
            continue
        index = model.index(i)
        option = QStyleOptionViewItem()
        option.rect, option.font = view.visualRect(index), view.font()
        option.state = QStyle.StateFlag.State_Enabled
        image = QImage(view.viewport().size(), QImage.Format.Format_ARGB32)
        painter = _TextsPainter(image)
        view.itemDelegate().paint(painter, option, index)
        painter.end()
        [out[model.row(i).title]] = painter.texts
    return out


def test_a_branch_copy_keeps_its_mark_in_view_where_the_title_is_cut(harness, qtbot):
    """Branch a chat whose title is wider than the sidebar: the copy's row shows the start
    of the title, then "…", then "(branch)", so the two rows tell apart; the original's is
    cut at its right as before."""
    from tests.app.messages.ui import click_control

    window = harness.open()
    harness.send("a question long enough that no sidebar shows all of it on one line at once")
    original = window.controller.conversation_id
    click_control(window, qtbot, 1, "Branch")
    qtbot.waitUntil(lambda: window.controller.conversation_id != original)
    painted = painted_titles(window)
    [copy] = [shown for whole, shown in painted.items() if whole.endswith(" (branch)")]
    [kept] = [shown for whole, shown in painted.items() if not whole.endswith(" (branch)")]
    assert copy.endswith("… (branch)") and copy.startswith("a question"), copy
    assert kept.endswith("…") and kept.startswith("a question"), kept
    metrics = QFontMetrics(window.sidebar.list.font())
    width = window.sidebar.list.visualRect(window.sidebar.model.index(1)).width() - 36
    assert metrics.horizontalAdvance(copy) <= width
    assert title_line("x (branch)", metrics, 10_000) == "x (branch)"  # whole where it fits
    assert title_line("a long title (branch)", metrics, 20).endswith("…")  # the mark too wide
