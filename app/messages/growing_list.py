"""The message list's geometry: every row laid out by Qt once, then the last row (a reply
streaming in) grown in place at the cost of that row alone.

QListView lays every row out again on any change of any row (its dataChanged schedules a
whole layout, which asks each row for its size hint: 300 calls into Python per push of a
reply under 300 messages). Here a change only repaints, unless a row's height changed:
a row above the last one moves the rows below it, so the list is laid out again, but the
last row is laid out TAIL_ROOM px taller than it is, and grows into that room with the
contents height as the only change. Qt keeps each row's top and the end of the last row
and asks the delegate for a row's height whenever it needs it (painting, hit tests), so
the tops stay exact while the room keeps the grown part reachable; past the room, the
whole list is laid out again.

Qt relays out on a resize only when the height changes; rows wrap to the width, so a new
width lays the list out again here. A new font reaches the delegate (Qt relays out).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QModelIndex
from PySide6.QtWidgets import QAbstractItemView, QListView, QStyleOptionViewItem

from app.messages.message_delegate import MessageDelegate

# px: room below the last row's true end in Qt's layout, which a reply grows into without
# a relayout: thousands of lines of text
TAIL_ROOM = 1 << 16


class GrowingListView(QListView):
    """A QListView of rows with one vertical flow and no spacing (Qt's defaults for a
    list), drawn by a MessageDelegate that subclasses set as `delegate`."""

    delegate: MessageDelegate

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._layout_width = 1

    def layout_width(self) -> int:
        """The width rows are laid out for: the viewport's with the scroll bar shown, so
        the bar appearing or going does not lay out every message again."""
        return self._layout_width

    def _delegate(self) -> MessageDelegate | None:
        return getattr(self, "delegate", None)  # Qt calls in before a subclass sets it

    # -- Qt's whole layout ------------------------------------------------------------

    def doItemsLayout(self) -> None:  # noqa: N802 - Qt's name
        delegate = self._delegate()
        if delegate is None:
            super().doItemsLayout()
            return
        delegate.tail_room = TAIL_ROOM  # the size hints Qt lays the rows out with
        try:
            super().doItemsLayout()
        finally:
            delegate.tail_room = 0

    def updateGeometries(self) -> None:  # noqa: N802 - Qt's name
        delegate = self._delegate()
        if delegate is not None:
            delegate.tail_room = 0  # Qt's pass over the rows, if one ran, is over
            self._fit_contents()
        super().updateGeometries()

    def _fit_contents(self) -> None:
        """The contents end where the last row really ends, not at the room Qt laid out."""
        model = self.model()
        rows = model.rowCount() if model is not None else 0
        tail = self.rectForIndex(model.index(rows - 1, 0)) if rows else None
        if tail is not None and tail.isValid():
            self.resizeContents(self.contentsSize().width(), tail.y() + tail.height())

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        bar_width = self.verticalScrollBar().sizeHint().width()
        width = max(1, self.width() - 2 * self.frameWidth() - bar_width)
        if width != self._layout_width:
            self._layout_width = width
            self.scheduleDelayedItemsLayout()  # every row wraps anew
        super().resizeEvent(event)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        delegate = self._delegate()
        is_new_font = event.type() == QEvent.Type.FontChange
        if is_new_font and delegate is not None and self.font() != delegate.body_font:
            delegate.set_font(self.font())  # and Qt lays every row out again

    # -- one row changed --------------------------------------------------------------

    def dataChanged(self, top: QModelIndex, bottom: QModelIndex, roles=()) -> None:  # noqa: N802
        # QAbstractItemView's, not QListView's: that one schedules a whole layout
        QAbstractItemView.dataChanged(self, top, bottom, list(roles))
        if not top.isValid() or not bottom.isValid():
            return
        self.executeDelayedItemsLayout()  # one already due (rows came or went) runs first
        last_row = self.model().rowCount() - 1
        if not self._rows_fit(top.row(), min(bottom.row(), last_row - 1)):
            self.doItemsLayout()
        elif bottom.row() == last_row:
            self._fit_last_row()
        for row in range(top.row(), bottom.row() + 1):
            index = self.model().index(row, 0)
            if self.isPersistentEditorOpen(index):
                option = QStyleOptionViewItem()
                option.rect = self.visualRect(index)
                self.delegate.updateEditorGeometry(self.indexWidget(index), option, index)
        self.viewport().update()

    def _rows_fit(self, first: int, last: int) -> bool:
        """Whether rows first..last (none of them the last row) are as tall as Qt laid
        them out: the gap to the next row's top, where Qt keeps it, against the height the
        delegate gives now."""
        if last < first:
            return True
        model = self.model()
        rect = self.rectForIndex(model.index(first, 0))
        for row in range(first, last + 1):
            below = self.rectForIndex(model.index(row + 1, 0))
            if below.y() - rect.y() != rect.height():
                return False
            rect = below
        return True

    def _fit_last_row(self) -> None:
        """The last row's new height: a new contents height while Qt still finds the row's
        bottom within the room it laid out, else a whole layout."""
        index = self.model().index(self.model().rowCount() - 1, 0)
        rect = self.rectForIndex(index)
        if rect.y() + rect.height() == self.contentsSize().height():
            return
        if self.indexAt(self.visualRect(index).bottomLeft()) == index:
            self.updateGeometries()
        else:
            self.doItemsLayout()
