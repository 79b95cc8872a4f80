"""Where each part of a message row goes: header (role, status, navigator), the bubble,
the footer (stats line, actions). Used alike for painting, size hints and hit tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import QRect
from PySide6.QtGui import QFontMetrics

from app.conversation.status import MessageStatus
from app.messages.message_model import MessageItem

COLUMN_MAX = 800  # the conversation column, centred; wider windows get wider margins
SIDE = 28
TOP = 4
ROW_GAP = 10
HEADER_H = 22
GAP = 4
PAD_X, PAD_Y = 16, 12
FOOTER_H = 22
USER_FRACTION = 0.8
ACTION_PAD = 8
NAV_ARROW_W = 22
MIN_BUBBLE_W = 72
THINK_H = 24  # the "Thinking (N tokens)" toggle above a reasoning reply

STATUS_PILLS: dict[str, str] = {
    MessageStatus.STREAMING: "generating…",
    MessageStatus.STOPPED: "stopped",
    MessageStatus.LENGTH: "max tokens",
    MessageStatus.CONTEXT_FULL: "context full",
    MessageStatus.EDITED: "edited",
    MessageStatus.FAILED: "failed",
}


@dataclass
class RowGeometry:
    height: int
    header: QRect
    bubble: QRect
    text: QRect  # where the document is drawn
    footer: QRect
    role_label: QRect
    pill: QRect | None = None
    nav_prev: QRect | None = None
    nav_label: QRect | None = None
    nav_next: QRect | None = None
    actions: list[tuple[str, QRect]] = field(default_factory=list)
    thinking_toggle: QRect | None = None
    thinking_box: QRect | None = None  # the open thinking block, above the answer
    thinking_text: QRect | None = None
    stats: QRect = field(default_factory=QRect)  # the figures line, left of the actions
    legend: QRect | None = None  # the drafted-tint swatch, when the text is tinted


def column(row: QRect) -> QRect:
    width = max(160, min(COLUMN_MAX, row.width() - 2 * SIDE))
    return QRect(row.x() + (row.width() - width) // 2, row.y(), width, row.height())


def max_text_width(row_width: int, role: str) -> int:
    col = column(QRect(0, 0, row_width, 0)).width()
    bubble = int(col * USER_FRACTION) if role == "user" else col
    return max(40, bubble - 2 * PAD_X)


def actions_for(item: MessageItem, *, is_last: bool, is_busy: bool) -> list[str]:
    names = [] if is_busy else ["Edit"]
    if item.role == "assistant" and not is_busy:
        names.append("Regenerate")
    if item.role == "user" and is_last and not is_busy:
        names.append("Retry")  # a question left without a reply (the request failed)
    names.append("Copy")
    if not is_busy:
        names.append("Branch")  # into a new chat holding the path up to this message
    if is_last and item.is_continuable and not is_busy:
        names.append("Continue")
    return names


def layout_row(
    row: QRect,
    item: MessageItem,
    *,
    text_size: tuple[int, int],  # the document's (ideal width, height)
    small: QFontMetrics,
    bold: QFontMetrics,
    actions: list[str],
    editor_height: int | None = None,
    legend_width: int = 0,
    thinking_width: int = 0,  # the toggle's; 0 when the reply has no thinking part
    thinking_height: int | None = None,  # the open block's text height; None: collapsed
) -> RowGeometry:
    col = column(row)
    is_user = item.role == "user"
    y = row.y() + TOP
    header = QRect(col.x(), y, col.width(), HEADER_H)
    y += HEADER_H + GAP
    toggle = box = box_text = None
    if thinking_width and editor_height is None:
        toggle = QRect(col.x(), y, thinking_width, THINK_H)
        y += THINK_H + GAP
        if thinking_height is not None:
            box = QRect(col.x(), y, col.width(), thinking_height + 2 * PAD_Y)
            box_text = box.adjusted(PAD_X, PAD_Y, -PAD_X, -PAD_Y)
            y += box.height() + GAP
    if editor_height is not None:
        bubble = QRect(col.x(), y, col.width(), editor_height)
    else:
        ideal, height = text_size
        width = col.width()
        if is_user:
            width = min(int(col.width() * USER_FRACTION), max(MIN_BUBBLE_W, ideal + 2 * PAD_X))
        x = col.right() + 1 - width if is_user else col.x()
        bubble = QRect(x, y, width, height + 2 * PAD_Y)
    text = bubble.adjusted(PAD_X, PAD_Y, -PAD_X, -PAD_Y)
    footer_h = 0 if editor_height is not None else FOOTER_H  # the editor has its buttons
    footer = QRect(col.x(), bubble.bottom() + 1 + GAP, col.width(), footer_h)
    height = footer.bottom() + 1 + ROW_GAP - row.y()

    role_name = "You" if is_user else "Assistant"
    label_w = bold.horizontalAdvance(role_name) + 2
    geometry = RowGeometry(height, header, bubble, text, footer, QRect())
    geometry.thinking_toggle, geometry.thinking_box, geometry.thinking_text = toggle, box, box_text
    if is_user:
        geometry.role_label = QRect(header.right() + 1 - label_w, header.y(), label_w, HEADER_H)
        nav_right = geometry.role_label.x() - 12
    else:
        geometry.role_label = QRect(header.x() + 2, header.y(), label_w, HEADER_H)
        nav_right = header.right() + 1
        pill_text = STATUS_PILLS.get(item.status)
        if pill_text:
            pill_w = small.horizontalAdvance(pill_text) + 16
            geometry.pill = QRect(geometry.role_label.right() + 9, header.y() + 2, pill_w, 18)
    if item.sibling_count > 1:
        label_w = small.horizontalAdvance(f"{item.sibling_count}/{item.sibling_count}") + 6
        geometry.nav_next = QRect(nav_right - NAV_ARROW_W, header.y(), NAV_ARROW_W, HEADER_H)
        geometry.nav_label = QRect(geometry.nav_next.x() - label_w, header.y(), label_w, HEADER_H)
        geometry.nav_prev = QRect(geometry.nav_label.x() - NAV_ARROW_W, header.y(), NAV_ARROW_W,
                                  HEADER_H)  # fmt: skip
    x = footer.right() + 1  # actions line up at the right, under the bubble
    for name in reversed(actions):
        width = small.horizontalAdvance(name) + 2 * ACTION_PAD
        x -= width
        geometry.actions.insert(0, (name, QRect(x, footer.y() + 1, width, FOOTER_H - 2)))
        x -= 2
    if editor_height is not None:
        geometry.actions = []
    left = footer.x() + 2
    if legend_width and editor_height is None:
        geometry.legend = QRect(left, footer.y() + 1, legend_width, FOOTER_H - 2)
        left = geometry.legend.right() + 1 + ACTION_PAD
    right = geometry.actions[0][1].x() - ACTION_PAD if geometry.actions else footer.right()
    geometry.stats = QRect(left, footer.y(), max(0, right - left), footer.height())
    return geometry
