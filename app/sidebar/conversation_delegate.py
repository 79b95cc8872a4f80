"""Paints the sidebar's rows: date headings, conversations and search hits (title and a
snippet of the matching message, the match in bold and kept in view: where the line is
short, the text before it gives way first). A branch copy's title keeps its "(branch)" in
view, so two chats of one start tell apart."""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter
from PySide6.QtWidgets import QStyle, QStyledItemDelegate

from app.conversation.branch_copy import BRANCH_MARK
from app.sidebar.conversation_list_model import ConversationListModel, Row
from app.theme import LIGHT, Theme


def hit_line(row: Row, plain: QFontMetrics, bold: QFontMetrics, width: int) -> tuple[str, ...]:
    """The snippet as (before, match, after) to paint in `width` pixels, the match in `bold`:
    whole where it fits; else the match whole (or elided itself where it alone is too
    wide), the text before it elided at its left to at most a third of the room left
    (less where the text after it is short), the text after it elided at its right."""
    start, end = row.match
    if start == end:
        return ("", "", plain.elidedText(row.snippet, Qt.TextElideMode.ElideRight, width))
    before, match, after = row.snippet[:start], row.snippet[start:end], row.snippet[end:]
    need = plain.horizontalAdvance(before) + bold.horizontalAdvance(match)
    if need + plain.horizontalAdvance(after) <= width:
        return (before, match, after)
    if bold.horizontalAdvance(match) >= width:
        return ("", bold.elidedText(match, Qt.TextElideMode.ElideRight, width), "")
    room = width - bold.horizontalAdvance(match)
    keep = max(room // 3, room - plain.horizontalAdvance(after))
    before = plain.elidedText(before, Qt.TextElideMode.ElideLeft, keep) if before else ""
    left = room - plain.horizontalAdvance(before)
    return (before, match, plain.elidedText(after, Qt.TextElideMode.ElideRight, left))


def title_line(title: str, metrics: QFontMetrics, width: int) -> str:
    """The title elided at its right to `width` pixels; a branch copy's " (branch)" stays
    whole, the text before it elided instead (unless the mark alone is too wide)."""
    if metrics.horizontalAdvance(title) <= width or not title.endswith(BRANCH_MARK):
        return metrics.elidedText(title, Qt.TextElideMode.ElideRight, width)
    room = width - metrics.horizontalAdvance(BRANCH_MARK)
    stem = metrics.elidedText(title[: -len(BRANCH_MARK)], Qt.TextElideMode.ElideRight, room)
    if room <= 0 or not stem:
        return metrics.elidedText(title, Qt.TextElideMode.ElideRight, width)
    return stem + BRANCH_MARK


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
        title = title_line(row.title, metrics, inner.width())
        if row.kind == "hit":
            top = QRect(inner.x(), inner.y() + 6, inner.width(), metrics.height())
            painter.drawText(top, Qt.AlignmentFlag.AlignLeft, title)
            small = QFont(option.font)
            small.setPointSizeF(small.pointSizeF() - 1)
            strong = QFont(small)
            strong.setWeight(QFont.Weight.Bold)
            fonts = (small, strong, small)
            pens = (QColor(t.muted), QColor(t.text), QColor(t.muted))
            line = top.translated(0, metrics.height() + 2)
            parts = hit_line(row, QFontMetrics(small), QFontMetrics(strong), inner.width())
            for text, font, pen in zip(parts, fonts, pens, strict=True):
                painter.setFont(font)
                painter.setPen(pen)
                painter.drawText(line, Qt.AlignmentFlag.AlignLeft, text)
                line.setLeft(line.left() + QFontMetrics(font).horizontalAdvance(text))
        else:
            painter.drawText(
                inner, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, title
            )
        painter.restore()
