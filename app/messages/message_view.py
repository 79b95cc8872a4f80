"""The list of message bubbles: tracks the mouse for hover and clicks (the delegate says
what is under the pointer), and stays pinned to the bottom while a reply streams in if
the person was at the bottom.

Text is selected by dragging (double-click: a word) and copied with Ctrl+C; every
control can be reached and activated from the keyboard (message_controls says which
keys), with a focus ring and accessible names, and a right-click on a message lists its
controls by those names (with Copy for a selection in it, and Delete).

A branch switch keeps the switched message where it was on screen, so the navigator
stays under the pointer and a second click walks on; when the new branch is too short
for that, the list gets blank room below its end (as chat apps have) instead of moving.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QModelIndex, QPoint, QRect, Qt, Signal
from PySide6.QtGui import (
    QClipboard,
    QColor,
    QContextMenuEvent,
    QGuiApplication,
    QKeyEvent,
    QKeySequence,
    QLinearGradient,
    QMouseEvent,
    QPainter,
    QTextCursor,
)
from PySide6.QtWidgets import QAbstractItemView, QListView, QMenu

from app.messages.growing_list import GrowingListView
from app.messages.message_controls import (
    Control,
    TextSelection,
    control_name,
    controls_of,
    message_name,
)
from app.messages.message_delegate import MessageDelegate
from app.messages.message_model import MessageModel
from app.theme import Theme

BOTTOM_SLACK = 24  # px: within this of the end counts as "at the bottom"
FADE_H = 28


class MessageListView(GrowingListView):
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
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # Tab reaches it; a click too
        self.setAccessibleName("Messages")
        self.setMouseTracking(True)
        self.setUniformItemSizes(False)
        self.verticalScrollBar().setSingleStep(24)
        self._is_following = True
        self._extra_bottom = 0  # px of blank room past the last message (see the docstring)
        self._focus_row = -1  # the message the keyboard is on
        self.context_menu: QMenu | None = None  # the last right-click's menu
        self._focus_control: Control | None = None  # None: the message itself
        self._is_selecting = False  # a drag that started in a message's text
        self._shows_ring = False  # the focus ring shows for keyboard use, not after a click
        self.verticalScrollBar().valueChanged.connect(self._remember_position)
        self.verticalScrollBar().rangeChanged.connect(self._keep_following)

    def setModel(self, model) -> None:  # noqa: N802 - Qt's name
        super().setModel(model)
        model.rowsRemoved.connect(self._on_rows_removed)

    def _on_rows_removed(self, _parent, first: int, _last: int) -> None:
        if first == 0:  # another conversation: its room, selection and focus go
            self._extra_bottom = 0
            self.delegate.selection = None
            self._focus_row, self._focus_control = -1, None

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
        selection = self.delegate.selection
        if self._is_selecting and selection is not None:
            row = self.model().row_of(selection.message_id)
            if row >= 0:
                index = self.model().index(row)
                at = self.delegate.text_position(self.visualRect(index), index, pos, selection.part)
                if at is not None:
                    self.delegate.selection = TextSelection(
                        selection.message_id, selection.part, selection.anchor, at[1]
                    )
        index, hit = self._hit(pos)
        over_text = index.isValid() and self.delegate.text_position(
            self.visualRect(index), index, pos
        )
        shape = Qt.CursorShape.PointingHandCursor if hit else Qt.CursorShape.ArrowCursor
        self.viewport().setCursor(Qt.CursorShape.IBeamCursor if over_text and not hit else shape)
        self.viewport().update()
        super().mouseMoveEvent(event)

    def leaveEvent(self, event: QEvent) -> None:
        self.delegate.hover_pos = None
        self.viewport().update()
        super().leaveEvent(event)

    def mousePressEvent(self, event: QMouseEvent) -> None:
        pos = event.position().toPoint()
        index, hit = self._hit(pos)
        if index.isValid():
            self._shows_ring = False
            self.setFocus(Qt.FocusReason.MouseFocusReason)
            self._set_focus(index.row(), hit)
        if hit is not None or event.button() != Qt.MouseButton.LeftButton:
            return
        at = (
            self.delegate.text_position(self.visualRect(index), index, pos)
            if index.isValid()
            else None
        )
        if at is None:
            self._set_selection(None)
            return super().mousePressEvent(event)
        message_id = index.data(MessageModel.IdRole)
        self._set_selection(TextSelection(message_id, at[0], at[1], at[1]))
        self._is_selecting = True

    def mouseDoubleClickEvent(self, event: QMouseEvent) -> None:
        pos = event.position().toPoint()
        index, hit = self._hit(pos)
        at = (
            self.delegate.text_position(self.visualRect(index), index, pos)
            if index.isValid()
            else None
        )
        if hit is not None or at is None:
            return super().mouseDoubleClickEvent(event)
        item = index.data(MessageModel.ItemRole)
        cursor = QTextCursor(self.delegate.document(item, at[0]))
        cursor.setPosition(at[1])
        cursor.select(QTextCursor.SelectionType.WordUnderCursor)
        self._set_selection(
            TextSelection(item.id, at[0], cursor.selectionStart(), cursor.selectionEnd())
        )

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return super().mouseReleaseEvent(event)
        if self._is_selecting:
            self._is_selecting = False
            clipboard = QGuiApplication.clipboard()
            text = self.selected_text()
            if text and clipboard.supportsSelection():  # X11's middle-click paste
                clipboard.setText(text, QClipboard.Mode.Selection)
            return None
        index, hit = self._hit(event.position().toPoint())
        if hit is None:
            return super().mouseReleaseEvent(event)
        message_id = index.data(MessageModel.IdRole)
        self.activate(message_id, hit[0], hit[1])

    # -- selection --------------------------------------------------------------------

    def _set_selection(self, selection: TextSelection | None) -> None:
        self.delegate.selection = selection
        self.viewport().update()

    def selected_text(self) -> str:
        """The selected characters as plain text (line breaks as \\n)."""
        selection = self.delegate.selection
        row = self.model().row_of(selection.message_id) if selection is not None else -1
        if selection is None or selection.is_empty or row < 0:
            return ""
        rendered = self.delegate.rendered_part(self.model().item(row), selection.part)
        return rendered.markdown.plain_text(selection.start, selection.end)

    def _select_all(self) -> None:
        if 0 <= self._focus_row < self.model().rowCount():
            item = self.model().item(self._focus_row)
            end = self.delegate.document(item, "body").characterCount() - 1
            self._set_selection(TextSelection(item.id, "body", 0, end))

    def _copy(self) -> None:
        text = self.selected_text()
        if not text and 0 <= self._focus_row < self.model().rowCount():
            text = self.model().item(self._focus_row).content  # the whole message
        if text:
            QGuiApplication.clipboard().setText(text)

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:  # noqa: N802 - Qt's name
        index = self.indexAt(event.pos())
        if not index.isValid():
            return
        item = self.model().item(index.row())
        menu = self.context_menu = QMenu(self)
        selection = self.delegate.selection
        if selection is not None and selection.message_id == item.id and self.selected_text():
            menu.addAction("Copy selection", self._copy)
            menu.addSeparator()
        ends = {"prev": item.sibling_index == 1, "next": item.sibling_index == item.sibling_count}
        for control, _rect in self._controls(index.row()):
            name = control_name(item, control)
            entry = menu.addAction(name, lambda c=control: self.activate(item.id, *c))
            entry.setEnabled(not ends.get(control[0], False))  # no version past either end
        menu.addSeparator()
        whose = "message" if item.role == "user" else "reply"
        menu.addAction(f"Delete {whose}", lambda: self.activate(item.id, "delete"))
        menu.popup(event.globalPos())

    # -- keyboard ---------------------------------------------------------------------

    def _controls(self, row: int) -> list[tuple[Control, QRect]]:
        index = self.model().index(row)
        geometry, entry = self.delegate.geometry(self.visualRect(index), index)
        return controls_of(geometry, entry)

    def _set_focus(self, row: int, control: Control | None) -> None:
        model = self.model()
        self._focus_row, self._focus_control = row, control
        is_shown = self.hasFocus() and row >= 0 and self._shows_ring
        self.delegate.focus = (row, control) if is_shown else None
        if 0 <= row < model.rowCount():
            item = model.item(row)
            description = message_name(item, row, model.rowCount())
            if control is not None:
                description += f". {control_name(item, control)}, button"
            self.setAccessibleDescription(description)
        self.viewport().update()

    def focused_control(self) -> tuple[int, Control | None]:
        return self._focus_row, self._focus_control

    def _reveal_focus(self) -> None:
        index = self.model().index(self._focus_row)
        rect = dict(self._controls(self._focus_row)).get(self._focus_control)
        rect = rect or self.visualRect(index)
        bar, height = self.verticalScrollBar(), self.viewport().height()
        if rect.height() > height or rect.top() < 0:
            bar.setValue(bar.value() + rect.top() - 8)
        elif rect.bottom() > height:
            bar.setValue(bar.value() + rect.bottom() - height + 8)
        self._is_following = False

    def _move_control(self, step: int) -> bool:
        """Move to the previous / next control of the focused message; False past the ends."""
        rows = self.model().rowCount()
        if not 0 <= self._focus_row < rows:
            return False
        controls = [control for control, _rect in self._controls(self._focus_row)]
        order: list[Control | None] = [None, *controls]
        at = order.index(self._focus_control) if self._focus_control in order else 0
        if not 0 <= at + step < len(order):
            return False
        self._set_focus(self._focus_row, order[at + step])
        self._reveal_focus()
        return True

    def focusNextPrevChild(self, next: bool) -> bool:  # noqa: N802, A002 - Qt's names
        self._shows_ring = True
        if self.hasFocus() and self._move_control(1 if next else -1):
            return True
        return super().focusNextPrevChild(next)

    def focusInEvent(self, event) -> None:
        rows = self.model().rowCount() if self.model() else 0
        if rows and not 0 <= self._focus_row < rows:
            self._focus_row = rows - 1  # the newest message, where a reader left off
        if event.reason() != Qt.FocusReason.MouseFocusReason:
            self._shows_ring = True
        super().focusInEvent(event)
        self._set_focus(self._focus_row, self._focus_control)

    def focusOutEvent(self, event) -> None:
        super().focusOutEvent(event)
        self.delegate.focus = None
        self.viewport().update()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        key, rows = event.key(), self.model().rowCount()
        if not self._shows_ring:
            self._shows_ring = True
            self._set_focus(self._focus_row, self._focus_control)
        if event.matches(QKeySequence.StandardKey.Copy):
            return self._copy()
        if event.matches(QKeySequence.StandardKey.SelectAll):
            return self._select_all()
        moves = {Qt.Key.Key_Up: self._focus_row - 1, Qt.Key.Key_Down: self._focus_row + 1,
                 Qt.Key.Key_Home: 0, Qt.Key.Key_End: rows - 1}  # fmt: skip
        if key in moves and rows:
            self._set_focus(max(0, min(rows - 1, moves[key])), None)
            return self._reveal_focus()
        if key in (Qt.Key.Key_Left, Qt.Key.Key_Right):
            self._move_control(-1 if key == Qt.Key.Key_Left else 1)
            return None
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Space):
            if self._focus_control is not None and 0 <= self._focus_row < rows:
                row, (action, argument) = self._focus_row, self._focus_control
                self.activate(self.model().item(row).id, action, argument)
                if self._focus_control not in dict(self._controls(row)):
                    self._set_focus(min(row, self.model().rowCount() - 1), None)
            return None
        if key == Qt.Key.Key_Escape and self.delegate.selection is not None:
            return self._set_selection(None)
        return super().keyPressEvent(event)
