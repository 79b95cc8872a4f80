"""Paints the model picker's rows: section headings, and each model as its name over a
muted line of facts (family, quantization, size, context); a model that cannot be picked
is drawn faded."""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QFont, QPainter, QPalette
from PySide6.QtWidgets import QStyle, QStyledItemDelegate

PathRole = Qt.ItemDataRole.UserRole + 1  # a path, or "shipped:<key>"; none on a heading


class ModelEntryDelegate(QStyledItemDelegate):
    def sizeHint(self, option, index) -> QSize:
        line = option.fontMetrics.height()
        return QSize(0, line + 14 if not index.data(PathRole) else 2 * line + 16)

    def paint(self, painter: QPainter, option, index) -> None:
        palette: QPalette = option.palette
        title, _, detail = str(index.data(Qt.ItemDataRole.DisplayRole)).partition("\n")
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = option.rect.adjusted(6, 2, -6, -2)
        muted = palette.color(QPalette.ColorRole.PlaceholderText)
        if not index.data(PathRole):  # a section heading
            font = QFont(option.font)
            font.setPointSizeF(font.pointSizeF() - 1.5)
            font.setWeight(QFont.Weight.DemiBold)
            painter.setFont(font)
            painter.setPen(muted)
            painter.drawText(rect.adjusted(8, 4, 0, 0), Qt.AlignmentFlag.AlignVCenter, title)
            painter.restore()
            return
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        enabled = bool(index.flags() & Qt.ItemFlag.ItemIsEnabled)
        if selected or option.state & QStyle.StateFlag.State_MouseOver:
            role = QPalette.ColorRole.Highlight if selected else QPalette.ColorRole.AlternateBase
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(palette.color(role))
            painter.drawRoundedRect(rect, 8, 8)
        text = palette.color(
            QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text
        )
        if not enabled:
            text = muted
        line = option.fontMetrics.height()
        name_font = QFont(option.font)
        name_font.setWeight(QFont.Weight.DemiBold)
        painter.setFont(name_font)
        painter.setPen(text)
        inner = rect.adjusted(12, 6, -12, -6)
        painter.drawText(QRect(inner.left(), inner.top(), inner.width(), line), 0, title)
        painter.setFont(option.font)
        painter.setPen(text if selected else muted)
        facts = QRect(inner.left(), inner.top() + line + 2, inner.width(), line)
        elided = option.fontMetrics.elidedText(detail, Qt.TextElideMode.ElideRight, facts.width())
        painter.drawText(facts, 0, elided)
        painter.restore()
