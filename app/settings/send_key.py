"""Which key sends the composer's message: Enter (Shift+Enter makes a new line), as in
every chat app people know, or Ctrl+Enter (Enter makes a new line) for those who write
long multi-line prompts."""

from __future__ import annotations

from enum import StrEnum


class SendKey(StrEnum):
    ENTER = "enter"
    CTRL_ENTER = "ctrl_enter"


SEND_KEYS: tuple[str, ...] = tuple(key.value for key in SendKey)
SEND_KEY_LABELS: dict[str, str] = {  # looked up by the plain string QSettings hands back
    SendKey.ENTER: "Enter sends",  # Shift+Enter: a new line
    SendKey.CTRL_ENTER: "Ctrl+Enter sends",  # Enter: a new line
}
