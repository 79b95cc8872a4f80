"""Paints a message as a bubble: header (role, status pill, branch navigator), the
Markdown body with code blocks, and a footer (stats line, actions). Documents and row
heights are cached per message, so only a message whose text changed is laid out again."""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, QModelIndex, QPoint, QRect, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QColor,
    QFont,
    QFontMetrics,
    QPainter,
    QPalette,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolTip,
    QWidget,
)

from app.conversation.status import MessageStatus
from app.messages.markdown import CODE_HEADER
from app.messages.message_editor import MessageEditor
from app.messages.message_layout import (
    PAD_X,
    STATUS_PILLS,
    RowGeometry,
    actions_for,
    layout_row,
    max_text_width,
)
from app.messages.message_model import MessageItem, MessageModel
from app.messages.rendered_message import RenderCache, Rendered
from app.theme import LIGHT, Theme
from engine.stats_format import message_line, message_tooltip

COPIED_FOR_S = 1.5
LEGEND_TEXT = "drafted"
LEGEND_TIP = (
    "Tinted text came from accepted drafts: speculative decoding guessed those tokens and "
    "the model checked each one, so the text is what it would have written anyway. The "
    "footer's figures say how many. Settings → \"Tint tokens that came from accepted "
    'drafts" turns the tint off.'
)


class MessageDelegate(QStyledItemDelegate):
    edit_saved = Signal(str, str)  # message id, new text
    edit_cancelled = Signal(str)

    def __init__(self, view: QWidget, theme: Theme = LIGHT) -> None:
        super().__init__(view)
        self._view = view
        self.theme = theme
        self.tint_drafted = False
        self.hover_pos: QPoint | None = None  # viewport coordinates, set by the view
        self._cache = RenderCache()
        # Row heights by message: a relayout of a long list asks every row for its size
        # hint, and all but the streamed one are unchanged.
        self._sizes: dict[str, tuple[tuple, QSize]] = {}
        self._copied: dict[tuple[str, int], float] = {}  # (message, code block) -> until
        self.set_font(view.font())

    def set_font(self, font: QFont) -> None:
        self.body_font = QFont(font)
        self.small_font = QFont(font)
        self.small_font.setPointSizeF(max(7.0, font.pointSizeF() - 1.5))
        self.bold_font = QFont(font)
        self.bold_font.setWeight(QFont.Weight.DemiBold)
        self.small_metrics = QFontMetrics(self.small_font)
        self.bold_metrics = QFontMetrics(self.bold_font)
        self.clear_caches()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.clear_caches()

    def set_tint_drafted(self, on: bool) -> None:
        self.tint_drafted = on
        self.clear_caches()

    def clear_caches(self) -> None:
        self._cache.clear()
        self._sizes.clear()

    def mark_copied(self, message_id: str, block: int) -> None:
        self._copied[(message_id, block)] = time.monotonic() + COPIED_FOR_S

    # -- rendering and geometry -------------------------------------------------------

    def rendered(self, item: MessageItem, row_width: int) -> Rendered:
        width = max_text_width(row_width, item.role)
        return self._cache.get(item, width, self.theme, self.body_font, self.tint_drafted)

    def _layout_width(self) -> int:
        layout_width = getattr(self._view, "layout_width", None)
        return layout_width() if layout_width else self._view.viewport().width()

    def geometry(self, rect: QRect, index: QModelIndex) -> tuple[RowGeometry, Rendered]:
        rect = QRect(rect.x(), rect.y(), self._layout_width(), rect.height())
        model = index.model()
        item: MessageItem = index.data(MessageModel.ItemRole)
        entry = self.rendered(item, rect.width())
        is_busy = isinstance(model, MessageModel) and model.is_busy
        is_editing = isinstance(model, MessageModel) and model.editing_id == item.id
        is_last = index.row() == model.rowCount() - 1
        geometry = layout_row(
            rect,
            item,
            text_size=(entry.ideal_width, entry.height),
            small=self.small_metrics,
            bold=self.bold_metrics,
            actions=actions_for(item, is_last=is_last, is_busy=is_busy),
            editor_height=self._editor_height(item, rect.width()) if is_editing else None,
            legend_width=self._legend_width(item),
        )
        return geometry, entry

    def _legend_width(self, item: MessageItem) -> int:
        if not (self.tint_drafted and item.draft_spans and item.role == "assistant"):
            return 0
        return self.small_metrics.horizontalAdvance(LEGEND_TEXT) + 20

    def footer_line(self, item: MessageItem) -> str:
        """The figures under a reply (none under a person's message)."""
        return message_line(item.stats) if item.role == "assistant" else ""

    def _editor_height(self, item: MessageItem, row_width: int) -> int:
        width = max_text_width(row_width, "assistant")
        metrics = QFontMetrics(self.body_font)
        flags = Qt.TextFlag.TextWordWrap
        text_h = metrics.boundingRect(QRect(0, 0, width, 100000), flags, item.content).height()
        return max(120, min(440, text_h + 90))

    def cached_size(self, index: QModelIndex) -> QSize | None:
        """The size last reported for this row's message, if any."""
        cached = self._sizes.get(index.data(MessageModel.IdRole))
        return cached[1] if cached is not None else None

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        width = self._layout_width()
        model = index.model()
        item: MessageItem = index.data(MessageModel.ItemRole)
        # Only what changes the height: actions come and go but the footer stays.
        is_editing = isinstance(model, MessageModel) and model.editing_id == item.id
        key = (item.content, item.role, width, is_editing)
        cached = self._sizes.get(item.id)
        if cached is not None and cached[0] == key:
            return cached[1]
        geometry, _ = self.geometry(QRect(0, 0, width, 0), index)
        size = QSize(width, geometry.height)
        self._sizes[item.id] = (key, size)
        return size

    # -- painting ---------------------------------------------------------------------

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        item: MessageItem = index.data(MessageModel.ItemRole)
        geometry, entry = self.geometry(option.rect, index)
        t = self.theme
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        self._paint_header(painter, item, geometry)
        is_editing = index.model().editing_id == item.id  # type: ignore[attr-defined]
        if not is_editing:
            is_user = item.role == "user"
            painter.setPen(Qt.PenStyle.NoPen if is_user else QColor(t.border))
            painter.setBrush(QColor(t.user_bubble if is_user else t.surface))
            painter.drawRoundedRect(QRectF(geometry.bubble).adjusted(0.5, 0.5, -0.5, -0.5), 14, 14)
            self._paint_body(painter, item, geometry, entry)
        self._paint_footer(painter, item, geometry)
        painter.restore()

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
        context = QAbstractTextDocumentLayout.PaintContext()
        palette = QPalette()
        palette.setColor(QPalette.ColorRole.Text, QColor(t.muted if not item.content else t.text))
        context.palette = palette
        # Draw only what is on screen: a long streamed reply is mostly scrolled away.
        visible = QRectF(g.text.intersected(self._view.viewport().rect()))
        context.clip = visible.translated(-g.text.x(), -g.text.y()).adjusted(0, -2, 1, 2)
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

    def _paint_button(self, painter: QPainter, rect: QRect, text: str, *, enabled: bool, big=False):
        t = self.theme
        hovered = enabled and self._is_hovered(rect)
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

    # -- tooltips ---------------------------------------------------------------------

    def helpEvent(self, event, view: QAbstractItemView, option, index: QModelIndex) -> bool:  # noqa: N802
        if event is None or event.type() != QEvent.Type.ToolTip or not index.isValid():
            return super().helpEvent(event, view, option, index)
        item: MessageItem = index.data(MessageModel.ItemRole)
        g, _ = self.geometry(option.rect, index)
        pos = event.pos()
        text = ""
        if g.legend is not None and g.legend.contains(pos):
            text = LEGEND_TIP
        elif g.stats.contains(pos) and self.footer_line(item):
            text = message_tooltip(item.stats)
        if text:
            QToolTip.showText(event.globalPos(), text, view.viewport(), g.footer)
        else:
            QToolTip.hideText()
        return True

    # -- hit testing ------------------------------------------------------------------

    def hit_test(self, rect: QRect, index: QModelIndex, pos: QPoint) -> tuple[str, object] | None:
        """What a click at `pos` (viewport coordinates) on this row means, if anything."""
        g, entry = self.geometry(rect, index)
        if g.nav_prev is not None and g.nav_prev.contains(pos):
            return ("prev", None)
        if g.nav_next is not None and g.nav_next.contains(pos):
            return ("next", None)
        for name, action_rect in g.actions:
            if action_rect.contains(pos):
                return (name.lower(), None)
        for number, code_rect in enumerate(entry.code_rects):
            if self._copy_rect(g, code_rect).contains(pos):
                return ("copy_code", number)
        if g.text.contains(pos):
            local = pos - g.text.topLeft()
            href = entry.markdown.doc.documentLayout().anchorAt(local.toPointF())
            if href:
                return ("link", href)
        return None

    # -- editing ----------------------------------------------------------------------

    def createEditor(self, parent: QWidget, option, index: QModelIndex) -> QWidget:
        item: MessageItem = index.data(MessageModel.ItemRole)
        editor = MessageEditor(item.role, item.content, parent)
        editor.saved.connect(lambda text, i=item.id: self.edit_saved.emit(i, text))
        editor.cancelled.connect(lambda i=item.id: self.edit_cancelled.emit(i))
        return editor

    def setEditorData(self, editor: QWidget, index: QModelIndex) -> None:
        pass  # the editor got its text when created; a stream must not overwrite edits

    def setModelData(self, editor: QWidget, model, index: QModelIndex) -> None:
        pass  # saving makes a new branch through the controller, never an in-place write

    def updateEditorGeometry(self, editor: QWidget, option, index: QModelIndex) -> None:
        geometry, _ = self.geometry(option.rect, index)
        editor.setGeometry(geometry.bubble)
