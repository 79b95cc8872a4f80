"""Deleting a message from the window (a message's right-click menu): the message and
every reply below it leave the chat, the banner offers Undo for ten seconds, and the
store keeps the rows until they are purged (ConversationStore.delete_message)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.window.main_window import MainWindow


def delete_message(window: MainWindow, message_id: str) -> bool:
    """False, with a notice, while a reply streams (it may be writing below the message)
    or when the store could not write."""
    controller, store = window.controller, window.store
    conversation_id = controller.conversation_id
    if conversation_id is None or message_id not in controller.tree:
        return False
    if controller.is_busy:
        window.banner.show_notice("Stop the reply before deleting a message.", timeout_ms=4000)
        return False
    role = controller.tree.node(message_id).role
    try:
        stamp, hidden = store.delete_message(message_id)
    except sqlite3.Error as exc:
        window.banner.show_error("The message could not be deleted.", str(exc))
        return False
    controller.open_conversation(conversation_id)
    window.refresh_sidebar()  # search hits in it are gone too
    what = "your message" if role == "user" else "the reply"
    below = hidden - 1
    if below:
        what += f" and the {below} message{'s' if below > 1 else ''} below it"

    def undo() -> None:
        store.restore_messages(conversation_id, stamp)
        if controller.conversation_id == conversation_id:
            controller.open_conversation(conversation_id, reveal=message_id)
        window.refresh_sidebar()

    window.banner.show_notice(f"Deleted {what}.", ("Undo", undo), timeout_ms=10000)
    return True
