"""Paints the sidebar's rows: date headings, conversations and search hits (title and a
snippet of the matching message)."""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter
from PySide6.QtWidgets import QStyle, QStyledItemDelegate

from app.sidebar.conversation_list_model import ConversationListModel, Row
from app.theme import LIGHT, Theme


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
