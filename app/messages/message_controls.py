"""A message's controls in keyboard order, with the names a screen reader says, and the
text selection the view keeps. Pure geometry and text; the view handles the keys.

Keys in the message list: Up/Down (and Home/End) move between messages; Tab and Right
move to the message's next control, Shift+Tab and Left to the previous one; Tab past
the last control leaves the list; Enter or Space activates the control; Ctrl+A selects
the message's text and Ctrl+C copies the selection (the whole message when none).
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QRect

from app.messages.message_layout import RowGeometry
from app.messages.message_model import MessageItem
from app.messages.rendered_message import Rendered

Control = tuple[str, object]  # (action, argument): what hit_test returns for a click


@dataclass(frozen=True)
class TextSelection:
    """Characters [start, end) of one message's document (`part`: "body" or "thinking")."""

    message_id: str
    part: str
    anchor: int
    position: int

    @property
    def start(self) -> int:
        return min(self.anchor, self.position)

    @property
    def end(self) -> int:
        return max(self.anchor, self.position)

    @property
    def is_empty(self) -> bool:
        return self.anchor == self.position


def controls_of(g: RowGeometry, entry: Rendered) -> list[tuple[Control, QRect]]:
    """Every control of a row, in reading order: thinking, branch arrows, code Copy
    buttons (inside the text), then the footer's actions."""
    out: list[tuple[Control, QRect]] = []
    if g.thinking_toggle is not None:
        out.append((("thinking", None), g.thinking_toggle))
    if g.nav_prev is not None and g.nav_next is not None:
        out += [(("prev", None), g.nav_prev), (("next", None), g.nav_next)]
    for number, frame in enumerate(entry.code_rects):
        copy = QRect(int(frame.right()) - 70, int(frame.y()), 70, 30)
        out.append((("copy_code", number), copy.translated(g.text.topLeft())))
    out += [((name.lower(), None), rect) for name, rect in g.actions]
    return out


def control_name(item: MessageItem, control: Control) -> str:
    """What a screen reader says for a control (the accessible name)."""
    action, argument = control
    if action == "prev":
        return f"Previous branch ({item.sibling_index} of {item.sibling_count})"
    if action == "next":
        return f"Next branch ({item.sibling_index} of {item.sibling_count})"
    if action == "thinking":
        return f"Thinking ({item.thinking_tokens} tokens): show or hide"
    if action == "copy_code":
        return f"Copy code block {int(argument) + 1}"  # type: ignore[call-overload]
    whose = "message" if item.role == "user" else "reply"
    names = {
        "edit": f"Edit {whose}",
        "regenerate": "Regenerate reply",
        "retry": "Retry: ask for a reply again",
        "copy": f"Copy {whose}",
        "branch": "Branch into a new chat up to here",
        "continue": "Continue reply",
    }
    return names.get(action, action.capitalize())


def message_name(item: MessageItem, row: int, count: int) -> str:
    """The accessible description of a message: who, where, and how it begins."""
    who = "Your message" if item.role == "user" else "Assistant reply"
    text = " ".join(item.content.split())
    begin = text[:120] + ("…" if len(text) > 120 else "")
    return f"{who}, {row + 1} of {count}: {begin}"
