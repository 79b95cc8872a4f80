"""The list of message bubbles: tracks the mouse for hover and clicks (the delegate says
what is under the pointer), and stays pinned to the bottom while a reply streams in if
the person was at the bottom.

A branch switch keeps the switched message where it was on screen, so the navigator
stays under the pointer and a second click walks on; when the new branch is too short
for that, the list gets blank room below its end (as chat apps have) instead of moving.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QModelIndex, QPoint, Qt, Signal
from PySide6.QtGui import QColor, QLinearGradient, QMouseEvent, QPainter
from PySide6.QtWidgets import QAbstractItemView, QListView, QStyleOptionViewItem

from app.messages.message_delegate import MessageDelegate
from app.messages.message_model import MessageModel
from app.theme import Theme

BOTTOM_SLACK = 24  # px: within this of the end counts as "at the bottom"
FADE_H = 28


class MessageListView(QListView):
    action_triggered = Signal(str, str, object)  # message id, action, argument

    def __init__(self, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("messageList")
        self.delegate = MessageDelegate(self, theme)
        self.setItemDelegate(self.delegate)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setResizeMode(QListView.ResizeMode.Adjust)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.setMouseTracking(True)
        self.setUniformItemSizes(False)
        self.verticalScrollBar().setSingleStep(24)
        self._is_following = True
        self._extra_bottom = 0  # px of blank room past the last message (see the docstring)
        self._layout_width = 1
        self.verticalScrollBar().valueChanged.connect(self._remember_position)
        self.verticalScrollBar().rangeChanged.connect(self._keep_following)

    def layout_width(self) -> int:
        """The width rows are laid out for: the viewport's with the scroll bar shown, so
        the bar appearing or going does not lay out every message again."""
        return self._layout_width

    def resizeEvent(self, event) -> None:
        bar_width = self.verticalScrollBar().sizeHint().width()
        self._layout_width = max(1, self.width() - 2 * self.frameWidth() - bar_width)
        super().resizeEvent(event)

    def setModel(self, model) -> None:  # noqa: N802 - Qt's name
        super().setModel(model)
        # A row whose text or edit state changed may change height: lay out again.
        model.dataChanged.connect(self._on_data_changed)
        model.rowsRemoved.connect(self._on_rows_removed)

    def _on_rows_removed(self, _parent, first: int, _last: int) -> None:
        if first == 0:  # another conversation: the room kept for this one goes
            self._extra_bottom = 0

    def updateGeometries(self) -> None:  # noqa: N802 - Qt's name
        super().updateGeometries()
        if getattr(self, "_extra_bottom", 0):  # Qt calls this before __init__ is done
            bar = self.verticalScrollBar()
            bar.setRange(0, bar.maximum() + self._extra_bottom)

    def activate(self, message_id: str, action: str, argument: object = None) -> None:
        """Emit a message action; a branch switch keeps that message where it is."""
        if action not in ("prev", "next"):
            self.action_triggered.emit(message_id, action, argument)
            return
        model = self.model()
        row = model.row_of(message_id) if isinstance(model, MessageModel) else -1
        if row < 0:
            self.action_triggered.emit(message_id, action, argument)
            return
        top_before = self.visualRect(model.index(row)).top()
        self._is_following = False
        self.action_triggered.emit(message_id, action, argument)
        self._keep_row_at(row, top_before)  # the sibling shown now is in the same row

    def _keep_row_at(self, row: int, top: int) -> None:
        model = self.model()
        if row >= model.rowCount():
            return
        self.doItemsLayout()  # the switch changed rows below: their heights are needed now
        bar = self.verticalScrollBar()
        self._extra_bottom = 0
        self.updateGeometries()
        wanted = bar.value() + self.visualRect(model.index(row)).top() - top
        self._extra_bottom = max(0, wanted - bar.maximum())
        self.updateGeometries()
        bar.setValue(max(0, wanted))

    def _on_data_changed(self, top: QModelIndex, bottom: QModelIndex, roles=()) -> None:
        # Lay the list out again only when a row's height changed (a streamed reply that
        # grew a line); otherwise repainting the rows is enough.
        model = self.model()
        is_taller = False
        option = QStyleOptionViewItem()  # sizeHint reads nothing from it
        for row in range(top.row(), bottom.row() + 1):
            index = model.index(row, 0)
            before = self.delegate.cached_size(index)
            if before is None or before != self.delegate.sizeHint(option, index):
                is_taller = True
            if self.isPersistentEditorOpen(index):
                editor = self.indexWidget(index)
                self.delegate.updateEditorGeometry(editor, self._option(index), index)
        if is_taller:
            self.delegate.sizeHintChanged.emit(top)
        self.viewport().update()

    def _option(self, index: QModelIndex) -> QStyleOptionViewItem:
        option = QStyleOptionViewItem()
        option.rect = self.visualRect(index)
        return option

    def paintEvent(self, event) -> None:
        super().paintEvent(event)
        if self.verticalScrollBar().value() > 0:  # fade out what scrolls under the header
            painter = QPainter(self.viewport())
            fade = QLinearGradient(0, 0, 0, FADE_H)
            color = QColor(self.delegate.theme.window)
            fade.setColorAt(0, color)
            color.setAlpha(0)
            fade.setColorAt(1, color)
            painter.fillRect(0, 0, self.viewport().width(), FADE_H, fade)
            painter.end()

    def scroll_to_bottom(self) -> None:
        self._is_following = True
        if self._extra_bottom:
            self._extra_bottom = 0
            self.updateGeometries()
        self.scrollToBottom()

    def scroll_to_message(self, message_id: str) -> None:
        model = self.model()
        if isinstance(model, MessageModel):
            row = model.row_of(message_id)
            if row == model.rowCount() - 1:
                self.scroll_to_bottom()
            elif row >= 0:
                self.scrollTo(model.index(row), QAbstractItemView.ScrollHint.PositionAtTop)

    def _remember_position(self, value: int) -> None:
        self._is_following = value >= self.verticalScrollBar().maximum() - BOTTOM_SLACK

    def _keep_following(self, _minimum: int, maximum: int) -> None:
        if self._is_following:
            self.verticalScrollBar().setValue(maximum)

    # -- mouse ------------------------------------------------------------------------

    def _hit(self, pos: QPoint) -> tuple[QModelIndex, tuple[str, object] | None]:
        index = self.indexAt(pos)
        if not index.isValid():
            return index, None
        return index, self.delegate.hit_test(self.visualRect(index), index, pos)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        pos = event.position().toPoint()
        self.delegate.hover_pos = pos
        _, hit = self._hit(pos)
        self.viewport().setCursor(
            Qt.CursorShape.PointingHandCursor if hit else Qt.CursorShape.ArrowCursor
        )
        self.viewport().update()
        super().mouseMoveEvent(event)

    def leaveEvent(self, event: QEvent) -> None:
        self.delegate.hover_pos = None
        self.viewport().update()
        super().leaveEvent(event)

    def mousePressEvent(self, event: QMouseEvent) -> None:
        _, hit = self._hit(event.position().toPoint())
        if hit is None:
            super().mousePressEvent(event)

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return super().mouseReleaseEvent(event)
        index, hit = self._hit(event.position().toPoint())
        if hit is None:
            return super().mouseReleaseEvent(event)
        message_id = index.data(MessageModel.IdRole)
        self.activate(message_id, hit[0], hit[1])
