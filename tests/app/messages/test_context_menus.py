"""Right-click menus: on a message, its controls by the names a screen reader says (and
Copy for a selection inside it) and Delete, which the banner's Undo takes back; on a chat
in the sidebar, Rename, Export and Delete.
Each is opened with a right-click and its entries triggered as a person picks them."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QContextMenuEvent
from PySide6.QtWidgets import QApplication, QLineEdit

from app.conversation.store_io import ExportFormat
from tests.app.window.test_chat_menu import numbered as _numbered


def right_click(widget, pos: QPoint) -> None:
    """The event a right-click (or the menu key) sends the widget under the pointer: QTest's
    clicks do not make one."""
    reason = QContextMenuEvent.Reason.Mouse
    QApplication.sendEvent(widget, QContextMenuEvent(reason, pos, widget.mapToGlobal(pos)))


def _right_click_message(window, qtbot, row: int):
    view = window.chat.list_view
    index = window.controller.model.index(row)
    view.scrollTo(index)
    qtbot.wait(10)
    geometry, _ = view.delegate.geometry(view.visualRect(index), index)
    right_click(view.viewport(), geometry.text.center())
    qtbot.waitUntil(lambda: view.context_menu is not None and view.context_menu.isVisible())
    return view.context_menu


def _entries(menu) -> dict:
    return {a.text(): a for a in menu.actions() if not a.isSeparator()}


def test_a_replys_menu_names_its_controls_and_each_acts(harness, qtbot):
    window = _numbered(harness)
    harness.send("question")
    menu = _right_click_message(window, qtbot, 1)
    entries = _entries(menu)
    assert list(entries) == [
        "Edit reply",
        "Regenerate reply",
        "Copy reply",
        "Branch into a new chat up to here",
        "Delete reply",
    ]
    entries["Regenerate reply"].trigger()
    menu.close()
    harness.wait_idle()
    assert harness.texts() == ["question", "Answer 2"]
    menu = _right_click_message(window, qtbot, 1)  # now with its versions
    entries = _entries(menu)
    assert list(entries)[:2] == ["Previous branch (2 of 2)", "Next branch (2 of 2)"]
    assert entries["Previous branch (2 of 2)"].isEnabled()
    assert not entries["Next branch (2 of 2)"].isEnabled()  # the last version
    entries["Previous branch (2 of 2)"].trigger()
    menu.close()
    qtbot.waitUntil(lambda: harness.texts() == ["question", "Answer 1"])
    QApplication.clipboard().setText("before")
    menu = _right_click_message(window, qtbot, 1)
    _entries(menu)["Copy reply"].trigger()
    menu.close()
    assert QApplication.clipboard().text() == "Answer 1"
    menu = _right_click_message(window, qtbot, 0)
    assert "Edit message" in _entries(menu)
    _entries(menu)["Edit message"].trigger()
    menu.close()
    assert window.chat.model.editing_id == harness.items()[0].id


def test_a_selection_in_the_message_is_copied_from_its_menu(harness, qtbot):
    window = _numbered(harness)
    harness.send("several words here")
    view = window.chat.list_view
    index = window.controller.model.index(0)
    geometry, _ = view.delegate.geometry(view.visualRect(index), index)
    word = geometry.text.topLeft() + QPoint(8, 8)  # inside the first word
    qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=word)
    qtbot.waitUntil(lambda: view.selected_text() != "")
    picked = view.selected_text()
    assert picked in ["several", "words", "here"]
    QApplication.clipboard().setText("before")
    menu = _right_click_message(window, qtbot, 0)
    assert menu.actions()[0].text() == "Copy selection"
    menu.actions()[0].trigger()
    menu.close()
    assert QApplication.clipboard().text() == picked
    menu = _right_click_message(window, qtbot, 1)  # not on another message's menu
    assert "Copy selection" not in _entries(menu)
    menu.close()


def _right_click_chat(window, qtbot):
    """Right-click the first chat of the sidebar's list (past its day header)."""
    listing = window.sidebar.list
    model = listing.model()
    rows = (model.index(r, 0) for r in range(model.rowCount()))
    index = next(i for i in rows if i.flags() & Qt.ItemFlag.ItemIsSelectable)
    right_click(listing.viewport(), listing.visualRect(index).center())
    menu = window.sidebar
    qtbot.waitUntil(lambda: menu.context_menu is not None and menu.context_menu.isVisible())
    return menu.context_menu


def test_a_chats_menu_renames_exports_and_deletes(harness, qtbot):
    window = _numbered(harness)
    harness.send("first question")
    cid = window.controller.conversation_id
    menu = _right_click_chat(window, qtbot)
    assert list(_entries(menu)) == ["Rename", "Export as Markdown…", "Export as JSON…", "Delete"]
    exported = []
    window.sidebar.export_requested.disconnect()  # not the file dialog: what it was asked
    window.sidebar.export_requested.connect(lambda *args: exported.append(args))
    _entries(menu)["Export as JSON…"].trigger()
    menu.close()
    assert exported == [(cid, ExportFormat.JSON)]
    menu = _right_click_chat(window, qtbot)
    _entries(menu)["Rename"].trigger()
    menu.close()
    editor = window.sidebar.list.findChild(QLineEdit)
    qtbot.waitUntil(lambda: editor is not None and editor.isVisible())
    editor.setText("Renamed chat")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: harness.store.get_conversation(cid).title == "Renamed chat")
    menu = _right_click_chat(window, qtbot)
    _entries(menu)["Delete"].trigger()
    menu.close()
    assert [c.id for c in harness.store.list_conversations()] == []
    assert window.banner.message.text() == "Deleted “Renamed chat”."


def test_deleting_a_version_shows_the_one_before_and_undo_brings_it_back(harness, qtbot):
    window = _numbered(harness)
    harness.send("question")
    harness.send("more")
    menu = _right_click_message(window, qtbot, 1)
    _entries(menu)["Regenerate reply"].trigger()
    menu.close()
    harness.wait_idle()
    assert harness.texts() == ["question", "Answer 3"]
    menu = _right_click_message(window, qtbot, 1)
    _entries(menu)["Delete reply"].trigger()
    menu.close()
    assert harness.texts() == ["question", "Answer 1", "more", "Answer 2"]
    assert (harness.items()[1].sibling_index, harness.items()[1].sibling_count) == (1, 1)
    assert window.banner.message.text() == "Deleted the reply."
    window.banner.action_button.click()  # Undo
    assert harness.texts() == ["question", "Answer 3"]
    assert harness.items()[1].sibling_count == 2
    menu = _right_click_message(window, qtbot, 0)  # the question takes all below it
    _entries(menu)["Delete message"].trigger()
    menu.close()
    assert harness.texts() == []
    assert window.banner.message.text() == ("Deleted your message and the 4 messages below it.")
    window.banner.action_button.click()
    assert harness.texts() == ["question", "Answer 3"]


def test_a_message_is_not_deleted_while_a_reply_streams(harness, qtbot):
    window = _numbered(harness)
    harness.send("question")
    harness.engine.pause_after = 1
    harness.send("another", wait=False)
    qtbot.waitUntil(lambda: harness.texts()[-1] == "Answer")
    menu = _right_click_message(window, qtbot, 0)
    _entries(menu)["Delete message"].trigger()
    menu.close()
    assert harness.texts()[:2] == ["question", "Answer 1"]
    assert window.banner.message.text() == "Stop the reply before deleting a message."
    window.controller.stop()
    harness.engine.resume()
    harness.wait_idle()
