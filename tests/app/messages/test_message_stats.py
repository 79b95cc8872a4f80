"""Each reply's own figures in its footer, with a tooltip saying what each means, kept
with the message: after a reload, over both parts of a continued reply, and for a reply
saved when the window closed mid-stream. The status line follows the open chat. The role
label's tooltip says when a message was written."""

from __future__ import annotations

import time

from PySide6.QtCore import QDate, QEvent, QLocale, QPoint, Qt
from PySide6.QtGui import QHelpEvent
from PySide6.QtWidgets import QApplication, QToolTip

from engine.stats_format import final_line
from tests.app.messages.ui import click_control


def footer_line(window, row: int) -> str:
    item = window.controller.model.item(row)
    return window.chat.delegate.footer_line(item)


def tooltip_at(window, qtbot, point: QPoint) -> str:
    viewport = window.chat.list_view.viewport()
    QToolTip.hideText()
    event = QHelpEvent(QEvent.Type.ToolTip, point, viewport.mapToGlobal(point))
    QApplication.sendEvent(viewport, event)
    qtbot.wait(10)
    return QToolTip.text()


def footer_geometry(window, row: int):
    view = window.chat.list_view
    index = window.controller.model.index(row)
    view.scrollTo(index)
    geometry, _ = view.delegate.geometry(view.visualRect(index), index)
    return geometry


def test_the_footer_shows_the_messages_own_figures_explained_and_kept(harness, qtbot):
    window = harness.open()
    harness.send("Hello there, how are you today?")  # 7 tokens; the fake drafted 7, kept 3
    line = footer_line(window, 1)
    assert (
        line == "7 tok · 50.0 tok/s · TTFT 0.05 s · reused 40 / prefilled 120 · 3/7 drafts accepted"
    )
    tip = tooltip_at(window, qtbot, footer_geometry(window, 1).stats.center())
    for meaning in (
        "7 tokens generated",
        "tokens per second",
        "time to first token",
        "40 prompt tokens reused",
        "120 prompt tokens computed",
        "3 of 7 drafted tokens accepted (43%)",
        "3 of this reply's 7 tokens (43%) came from accepted drafts",
    ):
        assert meaning in tip, (meaning, tip)
    harness.open()  # a restart: the figures were stored with the message
    conversation = harness.store.list_conversations()[0]
    window = harness.window
    window.controller.open_conversation(conversation.id)
    assert footer_line(window, 1) == line


def test_after_continue_the_footer_counts_the_whole_reply(harness, qtbot):
    window = harness.open()
    harness.engine.pause_after = 2
    harness.send("tell me a long story please", wait=False)
    qtbot.waitUntil(lambda: harness.texts()[-1] == "Echo: tell")
    window.controller.stop()
    harness.wait_idle()
    assert footer_line(window, 1).startswith("2 tok ·")
    harness.engine.pause_after = None
    click_control(window, qtbot, 1, "Continue")
    harness.wait_idle()
    assert harness.texts()[-1] == "Echo: tell and that is the rest."
    reply = harness.items()[-1]
    assert reply.stats["generated_tokens"] == 2 + 5 and reply.stats["parts"] == 2
    assert reply.stats["drafted"] == 2 + 5 and reply.stats["accepted"] == 1 + 2
    assert footer_line(window, 1).startswith("7 tok ·")
    tip = tooltip_at(window, qtbot, footer_geometry(window, 1).stats.center())
    assert "both parts" in tip or "2 requests" in tip
    stored = harness.store.load_tree(harness.store.list_conversations()[0].id).node(reply.id)
    assert stored.stats["generated_tokens"] == 7


def test_a_reply_saved_on_quit_keeps_its_figures(harness, qtbot):
    window = harness.open()
    harness.engine.pause_after = 3
    harness.send("tell me a long story please", wait=False)
    qtbot.waitUntil(lambda: harness.texts()[-1] == "Echo: tell me")
    qtbot.wait(50)
    harness.close()  # the window closes mid-reply
    window = harness.open()
    window.controller.open_conversation(harness.store.list_conversations()[0].id)
    reply = harness.items()[-1]
    assert (reply.content, reply.status) == ("Echo: tell me", "stopped")
    assert reply.stats["generated_tokens"] == 3
    assert reply.stats["reused_tokens"] == 40 and reply.stats["prefilled_tokens"] == 120
    assert reply.stats["ttft_s"] >= 0
    assert footer_line(window, 1).startswith("3 tok ·")


def test_the_status_line_shows_the_open_chats_last_request_only(harness, qtbot):
    window = harness.open()
    harness.send("a first chat with a long question in it")
    first = window.controller.conversation_id
    first_line = final_line(harness.items()[-1].stats)
    assert window.composer.status.text() == first_line
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.composer.status.text() == ""  # a new chat has no request yet
    harness.send("second")
    assert window.composer.status.text() == final_line(harness.items()[-1].stats) != first_line
    sidebar = window.sidebar
    index = sidebar.model.index(sidebar.model.row_of(first))
    rect = sidebar.list.visualRect(index)
    qtbot.mouseClick(sidebar.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: window.controller.conversation_id == first)
    assert window.composer.status.text() == first_line


def test_drafted_tokens_are_tinted_by_default_with_a_legend(harness, qtbot):
    window = harness.open()
    harness.send("Hello there, how are you today?")
    reply = harness.items()[1]
    assert reply.draft_spans, "the fake engine marks every other token as drafted"
    geometry = footer_geometry(window, 1)
    assert geometry.legend is not None
    tip = tooltip_at(window, qtbot, geometry.legend.center())
    assert "accepted drafts" in tip and "Settings" in tip


def test_a_messages_role_label_tells_when_it_was_written(harness, qtbot):
    """Hovering "You" or "Assistant" shows when the message was sent or the reply written,
    the time the store keeps (so after a restart too)."""
    from app.messages.message_model import when_written

    window = harness.open()
    harness.send("What time is it?")
    for row, word in ((0, "Sent"), (1, "Written")):
        item = window.controller.model.item(row)
        assert abs(item.created_at - time.time()) < 60, item.created_at
        tip = tooltip_at(window, qtbot, footer_geometry(window, row).role_label.center())
        assert tip == f"<qt><p>{when_written(item)}</p></qt>" and word in tip, tip
        day = QLocale().toString(QDate.currentDate(), QLocale.FormatType.LongFormat)
        assert day in tip, (day, tip)
    sent = window.controller.model.item(0).created_at
    window = harness.open()  # a restart
    window.controller.open_conversation(harness.store.list_conversations()[0].id)
    assert window.controller.model.item(0).created_at == sent
