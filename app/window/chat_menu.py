"""The Chat menu: the last reply of the branch shown, from the keyboard. Regenerate it
(Ctrl+R), walk its versions (Ctrl+[ and Ctrl+], the `< 2/3 >` under it), copy it
(Ctrl+Shift+C) and edit the last message you sent. Each entry does what the reply's own
buttons do. An entry is greyed while the menu is open where it would do nothing; closed,
every key stays live and a key that has nothing to act on does nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QMenu

from app.messages.message_model import MessageItem

if TYPE_CHECKING:
    from app.window.main_window import MainWindow

AddAction = Callable[[QMenu, str, Callable[[], object], str | None], QAction]


def last_reply(window: MainWindow) -> MessageItem | None:
    """The newest assistant message of the branch shown, or None."""
    replies = [item for item in window.controller.model.items if item.role == "assistant"]
    return replies[-1] if replies else None


def regenerate_last_reply(window: MainWindow) -> None:
    reply = last_reply(window)
    if reply is not None:
        window.controller.regenerate(reply.id)


def show_reply_version(window: MainWindow, step: int) -> None:
    """The last reply's previous (-1) or next (+1) version, as its `<` and `>` show."""
    reply = last_reply(window)
    if reply is not None and not window.controller.is_busy:
        window.controller.switch_branch(reply.id, step)


def copy_last_reply(window: MainWindow) -> None:
    reply = last_reply(window)
    if reply is not None and reply.content:
        QGuiApplication.clipboard().setText(reply.content)
        window.banner.show_notice("Copied the reply to the clipboard.", timeout_ms=2000)


def build_chat_menu(window: MainWindow, menu: QMenu, add: AddAction) -> None:
    """The entries into `menu`, each made by `add` (menus.py's: menu, text, slot, keys)."""
    regenerate = add(menu, "Regenerate reply", lambda: regenerate_last_reply(window), "Ctrl+R")
    previous = add(menu, "Previous version", lambda: show_reply_version(window, -1), "Ctrl+[")
    following = add(menu, "Next version", lambda: show_reply_version(window, 1), "Ctrl+]")
    copy = add(menu, "Copy reply", lambda: copy_last_reply(window), "Ctrl+Shift+C")
    menu.addSeparator()
    edit = add(menu, "Edit last message", window.edit_last_user_message, None)

    def grey_what_does_nothing() -> None:
        reply, busy = last_reply(window), window.controller.is_busy
        regenerate.setEnabled(reply is not None and not busy)
        previous.setEnabled(reply is not None and not busy and reply.sibling_index > 1)
        following.setEnabled(
            reply is not None and not busy and reply.sibling_index < reply.sibling_count
        )
        copy.setEnabled(reply is not None and bool(reply.content))
        edit.setEnabled(window.controller.last_user_message_id() is not None and not busy)

    def all_live() -> None:  # a disabled action's key would do nothing until the next opening
        for action in (regenerate, previous, following, copy, edit):
            action.setEnabled(True)

    menu.aboutToShow.connect(grey_what_does_nothing)
    menu.aboutToHide.connect(all_live)
