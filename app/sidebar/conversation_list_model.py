"""The sidebar's list as a list model: conversations under date headings, or search hits
(title and a snippet of the matching message); ConversationDelegate paints it."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt, Signal

from app.conversation.store import Conversation, SearchHit

DAY = 86400.0


@dataclass(frozen=True)
class Row:
    kind: str  # "header" | "conversation" | "hit"
    title: str
    conversation_id: str = ""
    message_id: str = ""
    snippet: str = ""
    match: tuple[int, int] = (0, 0)  # where the query lies in the snippet ((0, 0): nowhere)


def match_span(text: str, query: str) -> tuple[int, int]:
    """The first case-insensitive occurrence of `query` in `text` as (start, end), in
    `text`'s own characters; (0, 0) where there is none."""
    found = re.search(re.escape(query.strip()), text, re.IGNORECASE) if query.strip() else None
    return found.span() if found else (0, 0)


def date_group(timestamp: float, now: float) -> str:
    today = time.localtime(now)
    midnight = now - (today.tm_hour * 3600 + today.tm_min * 60 + today.tm_sec)
    if timestamp >= midnight:
        return "Today"
    if timestamp >= midnight - DAY:
        return "Yesterday"
    if timestamp >= midnight - 7 * DAY:
        return "Previous 7 days"
    if timestamp >= midnight - 30 * DAY:
        return "Previous 30 days"
    return "Older"


class ConversationListModel(QAbstractListModel):
    RowRole = Qt.ItemDataRole.UserRole + 1
    rename_requested = Signal(str, str)  # conversation id, new title

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._rows: list[Row] = []

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        row = self._rows[index.row()]
        if role == self.RowRole:
            return row
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return row.title
        if role == Qt.ItemDataRole.ToolTipRole and row.kind != "header":
            return row.snippet or row.title
        return None

    def setData(self, index, value, role: int = Qt.ItemDataRole.EditRole) -> bool:
        row = self._rows[index.row()] if index.isValid() else None
        title = str(value).strip()
        if row is None or row.kind != "conversation" or not title or title == row.title:
            return False
        self._rows[index.row()] = Row("conversation", title, row.conversation_id)
        self.dataChanged.emit(index, index)
        self.rename_requested.emit(row.conversation_id, title)
        return True

    def flags(self, index) -> Qt.ItemFlag:
        if not index.isValid() or self._rows[index.row()].kind == "header":
            return Qt.ItemFlag.NoItemFlags
        flags = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        if self._rows[index.row()].kind == "conversation":
            flags |= Qt.ItemFlag.ItemIsEditable
        return flags

    def row(self, number: int) -> Row:
        return self._rows[number]

    def row_of(self, conversation_id: str) -> int:
        for number, row in enumerate(self._rows):
            if row.kind == "conversation" and row.conversation_id == conversation_id:
                return number
        return -1

    def set_conversations(self, conversations: list[Conversation], now: float | None = None):
        now = time.time() if now is None else now
        rows, group = [], None
        for conversation in conversations:  # newest first
            heading = date_group(conversation.updated_at, now)
            if heading != group:
                rows.append(Row("header", heading))
                group = heading
            rows.append(Row("conversation", conversation.title, conversation.id))
        self._replace(rows)

    def set_hits(self, hits: list[SearchHit], query: str = "") -> None:
        heading = Row("header", f"{len(hits)} result{'s' if len(hits) != 1 else ''}")
        rows = [heading] + [
            Row(
                "hit",
                h.conversation_title,
                h.conversation_id,
                h.message_id,
                h.snippet,
                match_span(h.snippet, query),
            )
            for h in hits
        ]
        self._replace(rows)

    def _replace(self, rows: list[Row]) -> None:
        self.beginResetModel()
        self._rows = rows
        self.endResetModel()
