"""Paints a message as a bubble: header (role, status pill, branch navigator), the
Markdown body with code blocks, and a footer (stats line, actions). Documents and row
heights are cached per message, so only a message whose text changed is laid out again."""

from __future__ import annotations

import html
import time
from dataclasses import replace

from PySide6.QtCore import QEvent, QModelIndex, QPoint, QRect, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetrics,
    QPainter,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolTip,
    QWidget,
)

from app.conversation.status import MessageStatus
from app.messages.message_controls import Control, TextSelection, controls_of
from app.messages.message_editor import MessageEditor, ctrl_enter
from app.messages.message_layout import (
    RowGeometry,
    actions_for,
    layout_row,
    max_text_width,
)
from app.messages.message_model import MessageItem, MessageModel, when_written
from app.messages.message_paint import LEGEND_TEXT, LEGEND_TIP, MessagePainting
from app.messages.rendered_message import RenderCache, Rendered
from app.theme import LIGHT, Theme
from engine.stats_format import message_line, message_tooltip

COPIED_FOR_S = 1.5


class MessageDelegate(MessagePainting, QStyledItemDelegate):
    edit_saved = Signal(str, str)  # message id, new text
    edit_cancelled = Signal(str)

    def __init__(self, view: QWidget, theme: Theme = LIGHT) -> None:
        super().__init__(view)
        self._view = view
        self.theme = theme
        self.tint_drafted = False
        # which key saves an edit: the window hands in its message box's send-key test
        self.is_save = ctrl_enter
        self.hover_pos: QPoint | None = None  # viewport coordinates, set by the view
        self.selection: TextSelection | None = None  # set by the view
        self.focus: tuple[int, Control | None] | None = None  # (row, control): the view's
        self._cache = RenderCache()
        self._thinking_cache = RenderCache()
        # Row heights by message: a relayout of a long list asks every row for its size
        # hint, and all but the streamed one are unchanged.
        self._sizes: dict[str, tuple[tuple, QSize]] = {}
        # px added to the last row's size hint while the view lays out every row: the
        # room a streamed reply grows into without a relayout (growing_list says how)
        self.tail_room = 0
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
        self._thinking_cache.clear()
        self._sizes.clear()

    def mark_copied(self, message_id: str, block: int) -> None:
        self._copied[(message_id, block)] = time.monotonic() + COPIED_FOR_S

    # -- rendering and geometry -------------------------------------------------------

    def rendered(self, item: MessageItem, row_width: int) -> Rendered:
        width = max_text_width(row_width, item.role)
        return self._cache.get(item, width, self.theme, self.body_font, self.tint_drafted)

    def rendered_thinking(self, item: MessageItem, row_width: int) -> Rendered:
        width = max_text_width(row_width, "assistant")
        thought = replace(item, content=item.thinking, role="thinking", draft_spans=())
        return self._thinking_cache.get(thought, width, self.theme, self.small_font, False)

    @staticmethod
    def thinking_label(item: MessageItem) -> str:
        still = item.status == MessageStatus.STREAMING and not item.content
        count = item.thinking_tokens
        tokens = f" ({count} token{'s' if count != 1 else ''})" if count else ""
        return f"Thinking{'…' if still else ''}{tokens}"

    def _thinking_width(self, item: MessageItem) -> int:
        if item.role != "assistant" or not (item.thinking or item.thinking_tokens):
            return 0
        return self.small_metrics.horizontalAdvance("▾ " + self.thinking_label(item)) + 20

    def _is_thinking_open(self, index: QModelIndex, item: MessageItem) -> bool:
        model = index.model()
        return isinstance(model, MessageModel) and model.is_thinking_open(item.id)

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
            thinking_width=self._thinking_width(item),
            thinking_height=(
                self.rendered_thinking(item, rect.width()).height
                if self._is_thinking_open(index, item) and item.thinking
                else None
            ),
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

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        width = self._layout_width()
        model = index.model()
        # Asked of every row at each whole layout (new rows, a new width or font), so the
        # row's item comes from the model's list, not data().
        if isinstance(model, MessageModel):
            item = model.item(index.row())
            is_editing, is_open = model.editing_id == item.id, model.is_thinking_open(item.id)
        else:
            item, is_editing, is_open = index.data(MessageModel.ItemRole), False, False
        # Only what changes the height: actions come and go but the footer stays.
        thinking = (bool(item.thinking or item.thinking_tokens), is_open and item.thinking)
        key = (item.content, item.role, width, is_editing, thinking)
        cached = self._sizes.get(item.id)
        if cached is not None and cached[0] == key:
            size = cached[1]
        else:
            geometry, _ = self.geometry(QRect(0, 0, width, 0), index)
            size = QSize(width, geometry.height)
            self._sizes[item.id] = (key, size)
        if self.tail_room and index.row() == model.rowCount() - 1:
            return QSize(width, size.height() + self.tail_room)
        return size

    # -- painting ---------------------------------------------------------------------

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        item: MessageItem = index.data(MessageModel.ItemRole)
        geometry, entry = self.geometry(option.rect, index)
        t = self.theme
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        self._paint_header(painter, item, geometry)
        self._paint_thinking(painter, item, geometry)
        is_editing = index.model().editing_id == item.id  # type: ignore[attr-defined]
        if not is_editing:
            is_user = item.role == "user"
            painter.setPen(Qt.PenStyle.NoPen if is_user else QColor(t.border))
            painter.setBrush(QColor(t.user_bubble if is_user else t.surface))
            painter.drawRoundedRect(QRectF(geometry.bubble).adjusted(0.5, 0.5, -0.5, -0.5), 14, 14)
            self._paint_body(painter, item, geometry, entry)
        self._paint_footer(painter, item, geometry)
        if self.focus is not None and self.focus[0] == index.row():
            self._paint_focus(painter, self.focus_rect(geometry, entry, self.focus[1]))
        painter.restore()

    def focus_rect(self, g: RowGeometry, entry: Rendered, control: Control | None) -> QRect:
        """What the focus ring goes round: the control, or the whole bubble."""
        for candidate, rect in controls_of(g, entry):
            if candidate == control:
                return rect
        return g.bubble

    def text_position(
        self, rect: QRect, index: QModelIndex, pos: QPoint, part: str | None = None
    ) -> tuple[str, int] | None:
        """The character under `pos`: ("body" | "thinking", document position). With
        `part`, the nearest character of that part wherever `pos` is (a drag)."""
        g, entry = self.geometry(rect, index)
        item: MessageItem = index.data(MessageModel.ItemRole)
        areas = [("body", g.text, entry)]
        if g.thinking_text is not None:
            areas.append(("thinking", g.thinking_text, self.rendered_thinking(item, rect.width())))
        for name, area, rendered in areas:
            if (part is None and area.contains(pos)) or part == name:
                local = (pos - area.topLeft()).toPointF()
                layout = rendered.markdown.doc.documentLayout()
                return name, max(0, layout.hitTest(local, Qt.HitTestAccuracy.FuzzyHit))
        return None

    def rendered_part(self, item: MessageItem, part: str) -> Rendered:
        width = self._layout_width()
        if part == "thinking":
            return self.rendered_thinking(item, width)
        return self.rendered(item, width)

    def document(self, item: MessageItem, part: str):
        return self.rendered_part(item, part).markdown.doc

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
        elif g.role_label.contains(pos) and item.created_at:
            text = when_written(item)
        if text:
            # Rich text, so Qt wraps it to a readable width; one paragraph per figure.
            paragraphs = "".join(
                f"<p>{html.escape(line, quote=False)}</p>" for line in text.split("\n")
            )
            QToolTip.showText(
                event.globalPos(), f"<qt>{paragraphs}</qt>", view.viewport(), g.footer
            )
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
        if g.thinking_toggle is not None and g.thinking_toggle.contains(pos):
            return ("thinking", None)
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
        editor = MessageEditor(item.role, item.content, parent, self.is_save)
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
