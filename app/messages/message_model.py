"""The messages of the selected branch as a list model.

`set_items` diffs against what is shown (the common prefix stays, the tail is replaced),
so switching a branch deep in a long conversation keeps the rows above and the scroll
position. `update_text` changes one row's text and nothing else: that is the path a
streamed reply takes, at most ~30 times a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from PySide6.QtCore import (
    QAbstractListModel,
    QDateTime,
    QLocale,
    QModelIndex,
    QPersistentModelIndex,
    Qt,
)

from app.conversation.status import CONTINUABLE, MessageStatus

Index = QModelIndex | QPersistentModelIndex


@dataclass(frozen=True)
class MessageItem:
    id: str
    role: str
    content: str
    status: str = MessageStatus.DONE  # a MessageStatus
    stats: dict[str, Any] | None = field(default=None, compare=False)
    draft_spans: tuple[tuple[int, int], ...] = ()
    sibling_index: int = 1  # 1-based, for the navigator `2/3`
    sibling_count: int = 1
    thinking: str = ""  # a reasoning model's <think> part, shown collapsed above the answer
    thinking_tokens: int = 0
    created_at: float = field(default=0.0, compare=False)  # seconds since the epoch; 0: unknown

    @property
    def is_continuable(self) -> bool:
        return self.role == "assistant" and self.status in CONTINUABLE


def when_written(item: MessageItem) -> str:
    """The role label's tooltip: when the message was sent (yours) or the reply written, the
    date in the locale's long form and the time in its short one."""
    moment = QDateTime.fromMSecsSinceEpoch(round(item.created_at * 1000))
    locale = QLocale()
    day = locale.toString(moment.date(), QLocale.FormatType.LongFormat)
    clock = locale.toString(moment.time(), QLocale.FormatType.ShortFormat)
    return f"{'Sent' if item.role == 'user' else 'Written'} {day}, {clock}"


class MessageModel(QAbstractListModel):
    ItemRole = Qt.ItemDataRole.UserRole + 1
    IdRole = Qt.ItemDataRole.UserRole + 2

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._items: list[MessageItem] = []
        self._editing_id: str | None = None
        self._open_thinking: set[str] = set()  # replies whose thinking block is open
        self._is_busy = False

    # -- Qt model API -----------------------------------------------------------------

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._items)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._items):
            return None
        item = self._items[index.row()]
        if role == self.ItemRole:
            return item
        if role == self.IdRole:
            return item.id
        if role == Qt.ItemDataRole.AccessibleTextRole:  # what a screen reader says
            return f"{'You' if item.role == 'user' else 'Assistant'}: {item.content}"
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            return item.content if role == Qt.ItemDataRole.DisplayRole else None
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        flags = Qt.ItemFlag.ItemIsEnabled
        if index.isValid() and self._items[index.row()].id == self._editing_id:
            flags |= Qt.ItemFlag.ItemIsEditable
        return flags

    # -- reading ----------------------------------------------------------------------

    @property
    def items(self) -> list[MessageItem]:
        return list(self._items)

    def item(self, row: int) -> MessageItem:
        return self._items[row]

    def row_of(self, message_id: str) -> int:
        for row, item in enumerate(self._items):
            if item.id == message_id:
                return row
        return -1

    @property
    def editing_id(self) -> str | None:
        return self._editing_id

    @property
    def is_busy(self) -> bool:
        """A reply is being generated: actions that would start another are hidden."""
        return self._is_busy

    # -- writing ----------------------------------------------------------------------

    def set_items(self, items: list[MessageItem]) -> None:
        keep = 0
        while keep < min(len(items), len(self._items)) and items[keep].id == self._items[keep].id:
            keep += 1
        if keep < len(self._items):
            self.beginRemoveRows(QModelIndex(), keep, len(self._items) - 1)
            del self._items[keep:]
            self.endRemoveRows()
        changed = [row for row in range(keep) if items[row] != self._items[row]]
        for row in changed:
            self._items[row] = items[row]
        if changed:
            self.dataChanged.emit(self.index(changed[0]), self.index(changed[-1]))
        if keep < len(items):
            self.beginInsertRows(QModelIndex(), keep, len(items) - 1)
            self._items.extend(items[keep:])
            self.endInsertRows()

    def update_text(
        self,
        message_id: str,
        content: str,
        draft_spans: tuple[tuple[int, int], ...] | None = None,
        status: str | None = None,
        thinking: tuple[str, int] | None = None,  # the thinking part and its token count
    ) -> bool:
        """Change one message's text (and status); False when it is not shown."""
        row = self.row_of(message_id)
        if row < 0:
            return False
        item = self._items[row]
        self._items[row] = replace(
            item,
            content=content,
            draft_spans=item.draft_spans if draft_spans is None else draft_spans,
            status=item.status if status is None else status,
            thinking=item.thinking if thinking is None else thinking[0],
            thinking_tokens=item.thinking_tokens if thinking is None else thinking[1],
        )
        self.dataChanged.emit(self.index(row), self.index(row))
        return True

    def set_editing(self, message_id: str | None) -> None:
        rows = [self.row_of(i) for i in (self._editing_id, message_id) if i is not None]
        self._editing_id = message_id
        for row in rows:
            if row >= 0:
                self.dataChanged.emit(self.index(row), self.index(row))

    def is_thinking_open(self, message_id: str) -> bool:
        return message_id in self._open_thinking

    def toggle_thinking(self, message_id: str) -> None:
        """Open or close a reply's thinking block (a view state, not saved)."""
        self._open_thinking ^= {message_id}
        row = self.row_of(message_id)
        if row >= 0:
            self.dataChanged.emit(self.index(row), self.index(row))

    def set_busy(self, is_busy: bool) -> None:
        if is_busy != self._is_busy:
            self._is_busy = is_busy
            if self._items:
                self.dataChanged.emit(self.index(0), self.index(len(self._items) - 1))
