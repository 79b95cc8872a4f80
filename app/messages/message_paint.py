"""How a message row is painted, part by part: the header (role, status pill, branch
navigator), the thinking toggle and block, the body (code frames, then the document with
any selection), the footer (drafted legend, figures, actions) and the keyboard focus ring.
MessageDelegate mixes this in; geometry comes from message_layout."""

from __future__ import annotations

import time

from PySide6.QtCore import QRect, QRectF, Qt
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QColor,
    QFont,
    QPainter,
    QPalette,
    QTextCharFormat,
    QTextCursor,
)

from app.conversation.status import MessageStatus
from app.messages.markdown import CODE_HEADER
from app.messages.message_layout import PAD_X, STATUS_PILLS, RowGeometry
from app.messages.message_model import MessageItem

LEGEND_TEXT = "drafted"
LEGEND_TIP = (
    "Tinted text came from accepted drafts: speculative decoding guessed those tokens and "
    "the model checked each one, so the text is what it would have written anyway. The "
    "footer's figures say how many. Settings → \"Tint tokens that came from accepted "
    'drafts" turns the tint off.'
)


class MessagePainting:
    """The painting half of MessageDelegate (which provides the fonts, theme, caches)."""

    def _paint_header(self, painter: QPainter, item: MessageItem, g: RowGeometry) -> None:
        t = self.theme
        painter.setFont(self.bold_font)
        painter.setPen(QColor(t.text))
        align = Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft
        painter.drawText(g.role_label, align, "You" if item.role == "user" else "Assistant")
        painter.setFont(self.small_font)
        if g.pill is not None:
            color = QColor(t.accent if item.status == MessageStatus.STREAMING else t.warning)
            fill = QColor(color)
            fill.setAlpha(34)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(fill)
            painter.drawRoundedRect(QRectF(g.pill), 9, 9)
            painter.setPen(color)
            painter.drawText(
                g.pill, Qt.AlignmentFlag.AlignCenter, STATUS_PILLS.get(item.status, item.status)
            )
        if g.nav_label is not None and g.nav_prev is not None and g.nav_next is not None:
            can_prev, can_next = item.sibling_index > 1, item.sibling_index < item.sibling_count
            for rect, glyph, enabled in ((g.nav_prev, "‹", can_prev), (g.nav_next, "›", can_next)):
                self._paint_button(painter, rect, glyph, enabled=enabled, big=True)
            painter.setFont(self.small_font)
            painter.setPen(QColor(t.muted))
            label = f"{item.sibling_index}/{item.sibling_count}"
            painter.drawText(g.nav_label, Qt.AlignmentFlag.AlignCenter, label)

    def _paint_thinking(self, painter: QPainter, item: MessageItem, g: RowGeometry) -> None:
        if g.thinking_toggle is None:
            return
        t = self.theme
        is_open = g.thinking_box is not None
        label = ("▾ " if is_open else "▸ ") + self.thinking_label(item)
        self._paint_button(painter, g.thinking_toggle, label, enabled=True, framed=True)
        if g.thinking_box is None or g.thinking_text is None:
            return
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(t.hover))
        painter.drawRoundedRect(QRectF(g.thinking_box), 10, 10)
        painter.setBrush(QColor(t.border))
        bar = QRectF(
            g.thinking_box.x() + 6, g.thinking_box.y() + 8, 3, g.thinking_box.height() - 16
        )
        painter.drawRoundedRect(bar, 1.5, 1.5)
        doc = self.rendered_thinking(item, self._layout_width()).markdown.doc
        painter.save()
        painter.translate(g.thinking_text.topLeft())
        context = QAbstractTextDocumentLayout.PaintContext()
        palette = QPalette()
        palette.setColor(QPalette.ColorRole.Text, QColor(t.muted))
        context.palette = palette
        context.selections = self._selections(item.id, "thinking", doc)
        doc.documentLayout().draw(painter, context)
        painter.restore()

    def _paint_body(self, painter: QPainter, item: MessageItem, g: RowGeometry, entry) -> None:
        t = self.theme
        painter.save()
        painter.translate(g.text.topLeft())
        small = self.small_font
        blocks = zip(entry.code_rects, entry.markdown.code_blocks, strict=True)
        for number, (rect, block) in enumerate(blocks):
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(t.code_bg))
            painter.drawRoundedRect(rect, 10, 10)
            header = QRectF(rect.x(), rect.y(), rect.width(), CODE_HEADER)
            painter.setBrush(QColor(t.code_header))
            painter.setClipRect(header)
            painter.drawRoundedRect(rect, 10, 10)
            painter.setClipping(False)
            painter.setFont(small)
            painter.setPen(QColor("#9da7b3"))
            label_rect = header.adjusted(PAD_X - 4, 0, -PAD_X + 4, 0)
            align = Qt.AlignmentFlag.AlignVCenter
            painter.drawText(
                label_rect, align | Qt.AlignmentFlag.AlignLeft, block.language or "code"
            )
            copied = self._copied.get((item.id, number), 0) > time.monotonic()
            painter.setPen(
                QColor("#e6edf3" if self._is_hovered(self._copy_rect(g, rect)) else "#9da7b3")
            )
            painter.drawText(
                label_rect, align | Qt.AlignmentFlag.AlignRight, "Copied" if copied else "Copy"
            )
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(t.muted))
        for bar in entry.quote_bars:  # a Markdown block quote's bar, one per level
            painter.drawRoundedRect(bar, 1.5, 1.5)
        context = QAbstractTextDocumentLayout.PaintContext()
        palette = QPalette()
        palette.setColor(QPalette.ColorRole.Text, QColor(t.muted if not item.content else t.text))
        context.palette = palette
        # Draw only what is on screen: a long streamed reply is mostly scrolled away.
        visible = QRectF(g.text.intersected(self._view.viewport().rect()))
        context.clip = visible.translated(-g.text.x(), -g.text.y()).adjusted(0, -2, 1, 2)
        context.selections = self._selections(item.id, "body", entry.markdown.doc)
        entry.markdown.doc.documentLayout().draw(painter, context)
        painter.restore()

    def _paint_footer(self, painter: QPainter, item: MessageItem, g: RowGeometry) -> None:
        line = self.footer_line(item)
        painter.setFont(self.small_font)
        align = Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft
        if g.legend is not None:
            swatch = QRectF(g.legend.x(), g.legend.center().y() - 5, 12, 10)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(self.theme.drafted))
            painter.drawRoundedRect(swatch, 3, 3)
            painter.setPen(QColor(self.theme.muted))
            painter.drawText(g.legend.adjusted(16, 0, 0, 0), align, LEGEND_TEXT)
        if line:
            painter.setPen(QColor(self.theme.muted))
            metrics = self.small_metrics
            elided = metrics.elidedText(line, Qt.TextElideMode.ElideRight, g.stats.width())
            painter.drawText(g.stats, align, elided)  # the tooltip has every figure
        for name, rect in g.actions:
            self._paint_button(painter, rect, name, enabled=True)

    def _paint_button(
        self, painter: QPainter, rect: QRect, text: str, *, enabled: bool, big=False, framed=False
    ):
        t = self.theme
        hovered = enabled and self._is_hovered(rect)
        if framed and not hovered:
            painter.setPen(QColor(t.border))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(QRectF(rect).adjusted(0.5, 0.5, -0.5, -0.5), 6, 6)
        if hovered:
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(t.hover))
            painter.drawRoundedRect(QRectF(rect), 6, 6)
        color = QColor(t.text if hovered else t.muted)
        if not enabled:
            color.setAlpha(90)
        painter.setPen(color)
        if big:
            font = QFont(self.body_font)
            font.setPointSizeF(font.pointSizeF() + 3)
            painter.setFont(font)
        else:
            painter.setFont(self.small_font)
        painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, text)

    def _is_hovered(self, rect: QRect | QRectF) -> bool:
        return self.hover_pos is not None and QRectF(rect).contains(self.hover_pos)

    @staticmethod
    def _copy_rect(g: RowGeometry, code_rect: QRectF) -> QRectF:
        right = QRectF(code_rect.right() - 70, code_rect.y(), 70, CODE_HEADER)
        return right.translated(g.text.x(), g.text.y())

    def _selections(self, message_id: str, part: str, doc) -> list:
        """The view's text selection, if it lies in this document, as Qt paints one."""
        selection = self.selection
        if selection is None or selection.is_empty:
            return []
        if (selection.message_id, selection.part) != (message_id, part):
            return []
        cursor = QTextCursor(doc)
        last = doc.characterCount() - 1
        cursor.setPosition(min(selection.start, last))
        cursor.setPosition(min(selection.end, last), QTextCursor.MoveMode.KeepAnchor)
        highlight = QAbstractTextDocumentLayout.Selection()
        highlight.cursor = cursor
        fmt = QTextCharFormat()
        color = QColor(self.theme.accent)
        color.setAlpha(70)  # the text stays readable through it
        fmt.setBackground(color)
        highlight.format = fmt
        return [highlight]

    def _paint_focus(self, painter: QPainter, rect: QRect) -> None:
        """The keyboard focus ring: 2 px of the accent colour, clear of what it rings."""
        pen = painter.pen()
        pen.setColor(QColor(self.theme.accent))
        pen.setWidthF(2.0)
        painter.setPen(pen)
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRoundedRect(QRectF(rect).adjusted(-2, -2, 2, 2), 7, 7)
