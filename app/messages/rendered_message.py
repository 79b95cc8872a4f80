"""Rendered message documents, cached per message and laid out per width. Parsing the
Markdown is the costly part, so it happens once per text; a new width only re-wraps, and
a text that extends the cached one (a reply streaming in) is parsed from its last settled
cut on (markdown_stream.py), its document changed in place."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from PySide6.QtCore import QRectF
from PySide6.QtGui import QFont

from app.messages.markdown import (
    CODE_HEADER,
    CODE_PAD,
    QUOTE_INDENT,
    RenderedMarkdown,
    render,
    render_plain,
)
from app.messages.markdown_stream import Settled, render_appended
from app.messages.message_model import MessageItem
from app.theme import Theme

CACHE_SIZE = 600


@dataclass
class Rendered:
    key: tuple
    markdown: RenderedMarkdown
    width: int = -1
    ideal_width: int = 0
    code_rects: list[QRectF] = field(default_factory=list)  # the painted code frames
    quote_bars: list[QRectF] = field(default_factory=list)  # one bar per quote level
    settled: Settled | None = None  # the head a longer text may keep (markdown_stream.py)

    @property
    def height(self) -> int:
        # A code block's painted frame reaches below its last line's bottom margin,
        # which the document does not count when the block ends the message.
        bottoms = [self.markdown.doc.size().height(), *(r.bottom() for r in self.code_rects)]
        return math.ceil(max(bottoms))

    def wrap(self, width: int, *, shrink: bool) -> None:
        """Lay out for `width`; `shrink` narrows the document to its longest line."""
        if width == self.width:
            return
        doc = self.markdown.doc
        if shrink or doc.textWidth() != width:
            doc.setTextWidth(width)  # lays the whole document out again
        # else a document changed in place: Qt laid out the changed blocks again
        self.ideal_width = width
        if shrink:
            self.ideal_width = min(width, math.ceil(doc.idealWidth()))
            doc.setTextWidth(self.ideal_width)
        self.width = width
        layout = doc.documentLayout()
        self.code_rects = []
        for block in self.markdown.code_blocks:
            top = layout.blockBoundingRect(doc.findBlockByNumber(block.first_block)).top()
            bottom = layout.blockBoundingRect(doc.findBlockByNumber(block.last_block)).bottom()
            top -= CODE_HEADER + CODE_PAD
            self.code_rects.append(QRectF(0, top, doc.textWidth(), bottom + CODE_PAD + 4 - top))
        self.quote_bars = []
        for first, last, level in self.markdown.quote_blocks:
            top = layout.blockBoundingRect(doc.findBlockByNumber(first)).top()
            bottom = layout.blockBoundingRect(doc.findBlockByNumber(last)).bottom()
            for depth in range(level):
                x = depth * QUOTE_INDENT + 2
                self.quote_bars.append(QRectF(x, top, 3, bottom - top))


class RenderCache:
    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._size = size
        self._entries: OrderedDict[str, Rendered] = OrderedDict()

    def clear(self) -> None:
        self._entries.clear()

    def get(self, item: MessageItem, width: int, theme: Theme, font: QFont, tint: bool):
        spans = item.draft_spans if tint else ()
        key = (item.content, spans, theme.name)
        entry = self._entries.get(item.id)
        if entry is None or entry.key != key:
            text = item.content if item.content else "…"  # a reply still waiting
            settled = None
            if item.role in ("user", "thinking"):  # as written, not as Markdown
                markdown = render_plain(text, font)
            elif entry is not None and _extends(key, entry.key):
                previous = (entry.markdown, entry.settled)
                markdown, settled = render_appended(text, theme, font, spans, previous)
            else:
                markdown = render(text, theme, font, spans)
            entry = Rendered(key, markdown, settled=settled)
            self._entries[item.id] = entry
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        self._entries.move_to_end(item.id)
        entry.wrap(width, shrink=item.role == "user")  # a short question, a short bubble
        return entry


def _extends(key: tuple, cached: tuple) -> bool:
    """Whether a message's (content, spans, theme) grew from the cached one by appending."""
    return bool(cached[0]) and key[0].startswith(cached[0]) and key[2] == cached[2]
