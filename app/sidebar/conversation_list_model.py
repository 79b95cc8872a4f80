"""The sidebar's list: conversations under date headings, or search hits (title and a
snippet of the matching message). A list model plus a small delegate that paints it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QAbstractListModel, QModelIndex, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter
from PySide6.QtWidgets import QStyle, QStyledItemDelegate

from app.store import Conversation, SearchHit
from app.theme import LIGHT, Theme

DAY = 86400.0


@dataclass(frozen=True)
class Row:
    kind: str  # "header" | "conversation" | "hit"
    title: str
    conversation_id: str = ""
    message_id: str = ""
    snippet: str = ""


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

    def set_hits(self, hits: list[SearchHit]) -> None:
        heading = Row("header", f"{len(hits)} result{'s' if len(hits) != 1 else ''}")
        rows = [heading] + [
            Row("hit", h.conversation_title, h.conversation_id, h.message_id, h.snippet)
            for h in hits
        ]
        self._replace(rows)

    def _replace(self, rows: list[Row]) -> None:
        self.beginResetModel()
        self._rows = rows
        self.endResetModel()


class ConversationDelegate(QStyledItemDelegate):
    def __init__(self, parent=None, theme: Theme = LIGHT) -> None:
        super().__init__(parent)
        self.theme = theme

    def sizeHint(self, option, index) -> QSize:
        row: Row = index.data(ConversationListModel.RowRole)
        line = option.fontMetrics.height()
        if row.kind == "header":
            return QSize(0, line + 16)
        return QSize(0, 2 * line + 18 if row.kind == "hit" else line + 16)

    def paint(self, painter: QPainter, option, index) -> None:
        row: Row = index.data(ConversationListModel.RowRole)
        t = self.theme
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = option.rect.adjusted(8, 1, -8, -1)
        if row.kind == "header":
            font = QFont(option.font)
            font.setPointSizeF(font.pointSizeF() - 1.5)
            font.setWeight(QFont.Weight.DemiBold)
            painter.setFont(font)
            painter.setPen(QColor(t.muted))
            text_rect = rect.adjusted(10, 6, 0, 0)
            painter.drawText(
                text_rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, row.title
            )
            painter.restore()
            return
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        hovered = bool(option.state & QStyle.StateFlag.State_MouseOver)
        if selected or hovered:
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(t.selection if selected else t.hover))
            painter.drawRoundedRect(rect, 8, 8)
        painter.setFont(option.font)
        painter.setPen(QColor(t.text))
        metrics = QFontMetrics(option.font)
        inner = rect.adjusted(10, 0, -10, 0)
        title = metrics.elidedText(row.title, Qt.TextElideMode.ElideRight, inner.width())
        if row.kind == "hit":
            top = QRect(inner.x(), inner.y() + 6, inner.width(), metrics.height())
            painter.drawText(top, Qt.AlignmentFlag.AlignLeft, title)
            small = QFont(option.font)
            small.setPointSizeF(small.pointSizeF() - 1)
            painter.setFont(small)
            painter.setPen(QColor(t.muted))
            snippet = QFontMetrics(small).elidedText(
                row.snippet, Qt.TextElideMode.ElideRight, inner.width()
            )
            painter.drawText(
                top.translated(0, metrics.height() + 2), Qt.AlignmentFlag.AlignLeft, snippet
            )
        else:
            painter.drawText(
                inner, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, title
            )
        painter.restore()
