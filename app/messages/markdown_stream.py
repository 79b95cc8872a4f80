"""A growing reply rendered by its tail: the same document as `render`, at the cost of
parsing only what follows the reply's last settled cut (markdown_cuts.py).

While a reply streams, each push appends tokens to its text. The reply's document keeps
its settled head, the text before a cut, as rendered; what follows the head is removed and
the tail rendered again at each push; when a new cut appears, the text up to it joins
the head. A part (the head's new text, or the tail) is read by Qt after a stand-in
paragraph, so that Qt's reader treats its first block as it does after the head, never
as a document's first block; the part is then copied in from the stand-in's end, so that
its first block keeps its formats. Its block numbers shift by the head's block count less
the stand-in's one, and its formula images are named on from the head's.

The result equals a full `render` of the text: the same HTML and formats, code blocks,
quote runs and formulas (tests/app/messages/test_markdown_stream.py checks it at every
push of random replies, and each hazard below by name). Where a part could render
differently in the whole, the whole is rendered instead: link reference definitions (one
appended later turns text above it into a link), front matter, a formula across a cut,
a drafted span left open before a cut (its end marker lost in a link's URL: the whole
pairs its start with a later end), a code block right after one at the seam (the whole
styles the two as one), and a head shaded for inline code other than the whole text is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from PySide6.QtCore import QUrl
from PySide6.QtGui import QFont, QTextCursor, QTextDocument, QTextDocumentFragment, QTextFormat

from app.messages.markdown import (
    DRAFT_END,
    DRAFT_START,
    CodeBlock,
    MarkdownSource,
    RenderedMarkdown,
    build,
    markdown_source,
    render,
)
from app.messages.markdown_cuts import settled_cuts
from app.messages.math import Formula, find_formulas
from app.theme import Theme

STAND_IN = "x\n\n"  # the paragraph a part is read after, in place of the head
Spans = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Settled:
    """The head of a reply: its first `num_chars` characters, rendered as the first
    `doc_end` characters (`num_blocks` blocks) of the reply's document, and what the head
    was rendered with, so that a longer text can tell whether the head still holds."""

    num_chars: int
    doc_end: int
    num_blocks: int
    formulas: tuple[Formula, ...]
    spans: Spans  # drafted spans, cut at num_chars
    has_backtick: bool  # the head's Markdown has one (the whole text's inline code shading)
    has_inline_code: bool  # the shading the head was rendered with
    code_blocks: tuple[CodeBlock, ...]
    quote_blocks: tuple[tuple[int, int, int], ...]
    math_sources: dict[str, str]


def render_appended(
    text: str,
    theme: Theme,
    font: QFont,
    spans: Spans,
    previous: tuple[RenderedMarkdown, Settled | None] | None,
) -> tuple[RenderedMarkdown, Settled | None]:
    """`render(text)`, reusing `previous`, the rendering of a text that `text` extends
    (same theme and font), whose document it may change in place; and `text`'s head."""
    if not _may_settle(text):
        return render(text, theme, font, spans), None
    formulas = find_formulas(text)
    head = previous[1] if previous is not None else None
    if head is not None and not _still_holds(head, spans, formulas):
        head = None
    start = head.num_chars if head is not None else 0
    cut = _last_cut(text, start, formulas)
    if head is None and cut == 0:
        return render(text, theme, font, spans), None
    bounds = [(start, cut), (cut, len(text))] if cut > start else [(start, len(text))]
    first_image = len(head.math_sources) if head is not None else 0
    sources = []
    for a, b in bounds:
        part_formulas = [_moved(f, -a) for f in formulas if a <= f.start < b]
        sources.append(
            markdown_source(text[a:b], theme, font, _cut(spans, a, b), part_formulas, first_image)
        )
        first_image += len(sources[-1].images)
    had_backtick = head is not None and head.has_backtick
    has_inline_code = had_backtick or any("`" in source.text for source in sources)
    if previous is not None and head is not None:
        if head.has_inline_code != has_inline_code:
            return render_appended(text, theme, font, spans, None)
        rendered = previous[0]
    else:
        made = _first_head(cut, spans, formulas, sources.pop(0), theme, font, has_inline_code)
        if made is None:
            return render(text, theme, font, spans), None
        rendered, head = made
    parts = [
        build(source, theme, font, has_inline_code=has_inline_code, before=STAND_IN)
        for source in sources
    ]
    if not _joins_as_whole(rendered.doc, head, parts):
        return render(text, theme, font, spans), None
    return _append(rendered.doc, head, parts, sources, bounds[-len(sources) :], text, spans,
                   formulas)  # fmt: skip


def _may_settle(text: str) -> bool:
    """Whether any head of `text` can be settled at all."""
    return not (
        text.startswith("---")  # front matter, if a closing line comes later
        or "]:" in text  # a link reference definition changes links above it
        or "][" in text
        or "\r" in text
        or DRAFT_START in text
        or DRAFT_END in text
    )


def _still_holds(head: Settled, spans: Spans, formulas: list[Formula]) -> bool:
    """Whether `head`'s rendering is still that of the same characters in the new text:
    the same drafted spans and formulas there, none reaching across its end."""
    in_head = tuple(f for f in formulas if f.start < head.num_chars)
    return in_head == head.formulas and _cut(spans, 0, head.num_chars) == head.spans


def _last_cut(text: str, start: int, formulas: list[Formula]) -> int:
    """The last cut after `start` that no formula spans; `start` if none."""
    spanning = [f for f in formulas if f.end > start]
    for cut in reversed(settled_cuts(text, start)):
        if not any(f.start < cut < f.end for f in spanning):
            return cut
    return start


def _first_head(
    cut: int,
    spans: Spans,
    formulas: list[Formula],
    source: MarkdownSource,
    theme: Theme,
    font: QFont,
    has_inline_code: bool,
) -> tuple[RenderedMarkdown, Settled] | None:
    """The head up to the first cut, rendered as a document of its own."""
    rendered, is_open = build(source, theme, font, has_inline_code=has_inline_code)
    doc = rendered.doc
    if is_open or doc.isEmpty():
        return None
    doc.setUndoRedoEnabled(False)  # edited in place from now on: keep no history
    head = Settled(
        num_chars=cut,
        doc_end=doc.characterCount() - 1,
        num_blocks=doc.blockCount(),
        formulas=tuple(f for f in formulas if f.start < cut),
        spans=_cut(spans, 0, cut),
        has_backtick="`" in source.text,
        has_inline_code=has_inline_code,
        code_blocks=tuple(rendered.code_blocks),
        quote_blocks=tuple(rendered.quote_blocks),
        math_sources=dict(rendered.math_sources),
    )
    return rendered, head


def _joins_as_whole(
    doc: QTextDocument, head: Settled, parts: list[tuple[RenderedMarkdown, bool]]
) -> bool:
    """Whether the parts joined after the head render as the whole would: each has a block
    after the stand-in, none but the last leaves a drafted span open, and none begins with
    code right after code (the whole styles the two as one block)."""
    last_is_code = _is_code(doc.findBlockByNumber(head.num_blocks - 1))
    for number, (part, is_open) in enumerate(parts):
        first = part.doc.begin().next()
        if not first.isValid() or (is_open and number < len(parts) - 1):
            return False
        if last_is_code and _is_code(first):
            return False
        last_is_code = _is_code(part.doc.lastBlock())
    return True


def _append(
    doc: QTextDocument,
    head: Settled,
    parts: list[tuple[RenderedMarkdown, bool]],
    sources: list[MarkdownSource],
    bounds: list[tuple[int, int]],
    text: str,
    spans: Spans,
    formulas: list[Formula],
) -> tuple[RenderedMarkdown, Settled]:
    """The head's document with the parts in place of what followed the head; all parts
    but the last join the head."""
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()
    cursor.setPosition(head.doc_end)
    # Qt removes an empty block (a rule, the one after a table) with the text after it,
    # its format lost: a character in it keeps the block while the old tail goes.
    cursor.insertText("x")
    cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
    cursor.removeSelectedText()
    cursor.deletePreviousChar()
    settled = whole = head
    for (part, _), source, (_, end) in zip(parts, sources, bounds, strict=True):
        whole = _joined(whole, part, _copy_in(cursor, part.doc, source))
        if end < len(text):  # a part before the last cut: the head now reaches its end
            settled = whole = replace(
                whole,
                num_chars=end,
                doc_end=doc.characterCount() - 1,
                num_blocks=doc.blockCount(),
                formulas=tuple(f for f in formulas if f.start < end),
                spans=_cut(spans, 0, end),
                has_backtick=whole.has_backtick or "`" in source.text,
            )
    cursor.endEditBlock()
    markdown = RenderedMarkdown(
        doc, list(whole.code_blocks), dict(whole.math_sources), list(whole.quote_blocks)
    )
    return markdown, settled


def _copy_in(cursor: QTextCursor, part: QTextDocument, source: MarkdownSource) -> int:
    """Copy `part`, less its stand-in paragraph, to the end of the cursor's document;
    returns the number its first block takes less the one it had in `part`."""
    doc = cursor.document()
    shift = doc.blockCount() - 1
    for name, (image, _formula) in source.images.items():
        doc.addResource(QTextDocument.ResourceType.ImageResource, QUrl(name), image)
    copied = QTextCursor(part)
    copied.setPosition(part.begin().length() - 1)  # the stand-in's end: its block separator
    copied.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
    cursor.movePosition(QTextCursor.MoveOperation.End)
    cursor.insertFragment(QTextDocumentFragment(copied))
    return shift


def _joined(whole: Settled, part: RenderedMarkdown, shift: int) -> Settled:
    """`whole`'s lists with the part's after them, in the joined document's numbers. Quote
    runs never meet at the seam (a cut never begins a quote), so none joins across it."""
    code = tuple(
        CodeBlock(c.text, c.language, c.first_block + shift, c.last_block + shift)
        for c in part.code_blocks
    )
    quotes = tuple((first + shift, last + shift, level) for first, last, level in part.quote_blocks)
    return replace(
        whole,
        code_blocks=whole.code_blocks + code,
        quote_blocks=whole.quote_blocks + quotes,
        math_sources=whole.math_sources | part.math_sources,
    )


def _is_code(block) -> bool:
    return block.isValid() and block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence)


def _cut(spans: Spans, start: int, end: int) -> Spans:
    """The parts of `spans` within [start, end), from `start`."""
    return tuple((max(a, start) - start, min(b, end) - start) for a, b in spans
                 if a < end and b > start)  # fmt: skip


def _moved(formula: Formula, by: int) -> Formula:
    return replace(formula, start=formula.start + by, end=formula.end + by)
