"""The message list keeps every row where it belongs while the last one grows: a push of
a streamed reply asks the delegate about the rows it touches, not about every row.

Counted, not timed (see tests/app/window/test_streaming_perf.py): QListView lays every
row out again on any change, asking each of 302 rows for its size hint at every push
(~300 calls a push before session 40). A layout is checked against each row's geometry
computed afresh, past the delegate's size cache, so a stale cache (one kept across a new
font, or keyed without the width) fails it as a stale layout does.
"""

from __future__ import annotations

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QFont

from app.conversation.status import MessageStatus
from app.messages.message_delegate import MessageDelegate
from app.theme import DARK
from tests.app.messages.ui import open_long_conversation

NUM_TOKENS = 600
TOKEN_DELAY_S = 0.003  # ~1.8 s of stream: pushed ~30 times a second, not in one batch
NUM_EARLIER_TURNS = 150  # 300 messages above the streamed reply
PAUSE_AFTER = 6  # tokens streamed before the rest: the reply's first line
PIECES = ["The", " quick", " **brown**", " fox", " jumps", " over", " `lazy`", " dogs.", "\n\n"]
MAX_SIZE_HINTS_PER_PUSH = 12  # the reply's own (push, fit, hit test) and its repaints
LONG = "A sentence that runs long enough to wrap over a few lines of the column. " * 6


def _heights(view) -> list[int]:
    model = view.model()
    return [view.visualRect(model.index(row)).height() for row in range(model.rowCount())]


def _assert_laid_out(view) -> None:
    """Each row starts where the one above ends, as tall as its geometry computed now,
    and the contents (the scroll range) end where the last row ends."""
    model, width, bar = view.model(), view.layout_width(), view.verticalScrollBar()
    top = -bar.value()
    for row in range(model.rowCount()):
        index = model.index(row)
        rect = view.visualRect(index)
        fresh, _ = view.delegate.geometry(QRect(0, 0, width, 0), index)
        assert (row, rect.top(), rect.height()) == (row, top, fresh.height)
        top = rect.bottom() + 1
    assert bar.maximum() == max(0, top + bar.value() - view.viewport().height())


def test_a_push_asks_about_the_streamed_row_not_every_row(harness, qtbot, monkeypatch):
    counts = {"asked": 0, "computed": 0}
    asking: list[bool] = []
    size_hint, geometry = MessageDelegate.sizeHint, MessageDelegate.geometry

    def counted_size_hint(self, option, index):
        counts["asked"] += 1
        asking.append(True)
        try:
            return size_hint(self, option, index)
        finally:
            asking.pop()

    def counted_geometry(self, rect, index):
        counts["computed"] += bool(asking)  # a size hint the cache did not have
        return geometry(self, rect, index)

    # Before the window exists: PySide binds a delegate's Python override once.
    monkeypatch.setattr(MessageDelegate, "sizeHint", counted_size_hint)
    monkeypatch.setattr(MessageDelegate, "geometry", counted_geometry)
    window = open_long_conversation(harness, NUM_EARLIER_TURNS)
    assert counts["asked"] > 2 * NUM_EARLIER_TURNS, "the override was not counted"
    harness.engine.tokens_override = [PIECES[i % len(PIECES)] for i in range(NUM_TOKENS)]
    harness.engine.pause_after = PAUSE_AFTER
    harness.engine.token_delay = TOKEN_DELAY_S
    harness.send("Stream a lot, please.", wait=False)
    model = window.controller.model
    reply_row = model.rowCount() - 1
    qtbot.waitUntil(lambda: model.item(reply_row).content.startswith("The quick"))
    qtbot.wait(50)  # the new rows laid out (a whole layout each), before counting
    at_pushes: list[tuple[int, int]] = []

    def on_push(top, bottom, *_):
        if (top.row(), bottom.row()) == (reply_row, reply_row):
            at_pushes.append((counts["asked"], counts["computed"]))

    model.dataChanged.connect(on_push)  # after the view's own slot: its work is counted
    start = (counts["asked"], counts["computed"])
    harness.engine.resume()
    harness.wait_idle(timeout=20000)

    assert model.item(reply_row).content == "".join(harness.engine.tokens_override)
    num_pushes = len(at_pushes)
    asked, computed = (at_pushes[-1][i] - start[i] for i in (0, 1))
    assert num_pushes >= 20
    assert asked <= MAX_SIZE_HINTS_PER_PUSH * num_pushes, f"{asked} for {num_pushes} pushes"
    assert computed <= num_pushes, f"{computed} computed for {num_pushes} pushes"
    _assert_laid_out(window.chat.list_view)


def test_the_last_row_grows_in_place_and_its_new_part_is_reached(harness, qtbot):
    window = open_long_conversation(harness, 20)
    view, model = window.chat.list_view, window.controller.model
    index = model.index(model.rowCount() - 1)
    reply_id, text, heights = model.item(index.row()).id, "", []
    for paragraph in range(40):
        text += f"Paragraph {paragraph}: {LONG}\n\n"
        model.update_text(reply_id, text, status=MessageStatus.STREAMING)
        qtbot.wait(1)
        heights.append(view.visualRect(index).height())
    assert heights == sorted(set(heights)), "the reply did not grow at each push"
    assert heights[-1] - heights[0] > 3 * view.viewport().height()
    _assert_laid_out(view)
    bar = view.verticalScrollBar()
    assert bar.value() == bar.maximum() > 0, "the list stopped following the reply"
    # The reply's end, far below where the list ended before the pushes, is found by Qt
    # (a hit test, a hover, a repaint of that strip alone), as if laid out anew.
    geometry, _ = view.delegate.geometry(view.visualRect(index), index)
    copy = dict(geometry.actions)["Copy"]
    assert view.viewport().rect().contains(copy)
    assert view.indexAt(copy.center()) == index
    qtbot.mouseMove(view.viewport(), copy.center())
    assert view.viewport().cursor().shape() == Qt.CursorShape.PointingHandCursor
    image = view.viewport().grab(copy).toImage()
    pixels = {image.pixel(x, y) for x in range(image.width()) for y in range(image.height())}
    assert len(pixels) > 1, "the strip with the reply's end was not painted"


def test_a_row_above_the_last_that_changes_height_moves_the_rows_below(harness, qtbot):
    window = open_long_conversation(harness, 10)
    view, model = window.chat.list_view, window.controller.model
    before = _heights(view)
    model.update_text(model.item(3).id, LONG)
    assert _heights(view)[3] > before[3]
    _assert_laid_out(view)
    model.set_editing(model.item(5).id)  # the editor is taller than the question
    _assert_laid_out(view)
    model.set_editing(None)
    _assert_laid_out(view)


def test_a_new_width_wraps_every_row_anew(harness, qtbot):
    window = open_long_conversation(harness, 10, answer=f"Answer {{turn}}. {LONG}")
    view = window.chat.list_view
    before, width = _heights(view), view.layout_width()
    window.resize(700, 700)
    qtbot.waitUntil(lambda: view.layout_width() < width)
    qtbot.wait(20)  # the layout Qt was asked for
    _assert_laid_out(view)
    after = _heights(view)
    assert all(a > b for a, b in zip(after[1::2], before[1::2], strict=True)), "not rewrapped"


def test_a_new_theme_or_font_lays_every_row_out_again(harness, qtbot):
    window = open_long_conversation(harness, 10, answer=f"Answer {{turn}}. {LONG}")
    view = window.chat.list_view
    window.set_theme(DARK)
    _assert_laid_out(view)
    before = _heights(view)
    font = QFont(view.font())
    font.setPointSizeF(font.pointSizeF() + 4)
    view.setFont(font)
    qtbot.wait(20)
    _assert_laid_out(view)
    assert all(a > b for a, b in zip(_heights(view), before, strict=True))
