"""A message's Markdown as a laid-out QTextDocument: Qt's own Markdown reader, then code
blocks restyled and highlighted, inline code shaded, and drafted spans tinted.

Drafted spans are character ranges of the Markdown source. They are carried through the
Markdown reader as private-use marker characters, found in the finished document, turned
into a background tint and removed, so the tint lands on the rendered text.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import (
    QColor,
    QFont,
    QImage,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextImageFormat,
)

from app.messages.highlight import code_spans
from app.messages.math import Formula, find_formulas, typeset
from app.theme import CODE_COLORS, Theme

DRAFT_START, DRAFT_END = "\ue000", "\ue001"
CODE_HEADER = 30  # px above a code block's first line: the strip with language and Copy
CODE_PAD = 10
CODE_INDENT = 14
CODE_GAP = 10  # px between a code block and the prose around it
QUOTE_INDENT = 16  # px a block quote is indented per level; its bar sits in that room
# Block syntax at a line start that a marker placed before it would break.
BLOCK_PREFIX = re.compile(r"[ \t]*(?:(?:[-*+]|\d+[.)]|#{1,6}|>)[ \t]+)*")
# runs of emphasis delimiters: whether one opens or closes depends on its neighbours, so a
# draft marker beside it (neither space nor punctuation) could leave `**` on the screen
DELIMITER_RUN = re.compile(r"\*+|_+|~+")
FENCE = re.compile(r"[ \t]{0,3}(?:```|~~~)")


@dataclass(frozen=True)
class CodeBlock:
    text: str
    language: str
    first_block: int  # block numbers in the document, inclusive
    last_block: int


@dataclass
class RenderedMarkdown:
    doc: QTextDocument
    code_blocks: list[CodeBlock]
    math_sources: dict[str, str] = field(default_factory=dict)  # image name -> its LaTeX
    quote_blocks: list[tuple[int, int, int]] = field(default_factory=list)  # first, last, level

    def plain_text(self, start: int, end: int) -> str:
        """Characters [start, end) as plain text: line breaks as \\n, formulas as their source."""
        cursor = QTextCursor(self.doc)
        last = self.doc.characterCount() - 1
        cursor.setPosition(min(start, last))
        cursor.setPosition(min(end, last), QTextCursor.MoveMode.KeepAnchor)
        text = cursor.selectedText()
        if "\ufffc" in text and self.math_sources:
            pieces, position = [], min(start, last)
            for char in text:
                position += 1
                if char == "\ufffc":
                    probe = QTextCursor(self.doc)
                    probe.setPosition(position)  # the format of the character before
                    char = self.math_sources.get(probe.charFormat().toImageFormat().name(), "")
                pieces.append(char)
            text = "".join(pieces)
        return text.replace("\u2029", "\n").replace("\u2028", "\n")


def render(
    text: str,
    theme: Theme,
    font: QFont,
    draft_spans: tuple[tuple[int, int], ...] = (),
) -> RenderedMarkdown:
    source = markdown_source(text, theme, font, draft_spans, find_formulas(text))
    return build(source, theme, font, has_inline_code="`" in source.text)[0]


@dataclass
class MarkdownSource:
    """A message's text as Qt's Markdown reader gets it: formulas replaced by images (named
    from `first_image` on), drafted spans marked."""

    text: str  # formulas replaced, no markers
    marked: str
    images: dict[str, tuple[QImage, Formula]]
    has_spans: bool


def markdown_source(
    text: str,
    theme: Theme,
    font: QFont,
    draft_spans: tuple[tuple[int, int], ...],
    formulas: list[Formula],
    first_image: int = 0,
) -> MarkdownSource:
    images: dict[str, tuple[QImage, Formula]] = {}
    if formulas:
        size_px = font.pixelSize() if font.pixelSize() > 0 else font.pointSizeF() * 96 / 72
        size_px *= 1.15  # STIX Two Math's x-height is smaller than the UI font's
        text, draft_spans, images = _with_formula_images(
            text, draft_spans, formulas, size_px, theme.text, first_image
        )
    marked = with_draft_markers(text, draft_spans) if draft_spans else text
    return MarkdownSource(text, marked, images, bool(draft_spans))


def build(
    source: MarkdownSource,
    theme: Theme,
    font: QFont,
    *,
    has_inline_code: bool,
    before: str = "",
) -> tuple[RenderedMarkdown, bool]:
    """The document of `source` read after the Markdown `before`, and whether a drafted
    span is left open at its end (its end marker lost in Markdown syntax, a link's URL)."""
    doc = QTextDocument()
    doc.setDefaultFont(font)
    doc.setDocumentMargin(0)
    doc.setMarkdown(before + source.marked)
    sources = _place_formulas(doc, source.images) if source.images else {}
    is_open = _tint_marked(doc, QColor(theme.drafted)) if source.has_spans else False
    code_blocks = _style_blocks(doc, theme, has_inline_code)
    if code_blocks and code_blocks[0].first_block == 0:
        # Qt drops the first block's top margin, which is where a code block keeps its
        # header strip; the root frame's margin makes that room instead.
        frame = doc.rootFrame().frameFormat()
        frame.setTopMargin(CODE_HEADER + CODE_PAD)
        doc.rootFrame().setFrameFormat(frame)
    return RenderedMarkdown(doc, code_blocks, sources, _mark_quotes(doc)), is_open


def _with_formula_images(
    text: str, spans, formulas: list[Formula], size_px: float, color: str, first_image: int
):
    """`text` with each formula replaced by a Markdown image of it (a formula that does
    not typeset becomes code showing its source), the drafted spans moved to match."""
    out: list[str] = []
    images: dict[str, tuple[QImage, Formula]] = {}
    shift: list[tuple[int, int, int]] = []  # (source start, source end, offset) of kept text
    at = 0
    for formula in formulas:
        shift.append((at, formula.start, len("".join(out)) - at))
        out.append(text[at : formula.start])
        image = typeset(formula.latex, formula.is_display, size_px, color)
        name = f"math:{first_image + len(images)}"
        if image is None:
            tick = "```" if formula.is_display else "`"
            piece = f"\n\n```latex\n{formula.latex}\n```\n\n" if formula.is_display else (
                f"{tick}{formula.source}{tick}")  # fmt: skip
        else:
            images[name] = (image, formula)
            piece = f"![math]({name})"
            piece = f"\n\n{piece}\n\n" if formula.is_display else piece
        out.append(piece)
        at = formula.end
    shift.append((at, len(text), len("".join(out)) - at))
    out.append(text[at:])
    moved = []
    for a, b in spans:  # keep the parts of each span outside formulas, shifted
        for start, end, offset in shift:
            lo, hi = max(a, start), min(b, end)
            if lo < hi:
                moved.append((lo + offset, hi + offset))
    return "".join(out), tuple(moved), images


def _place_formulas(doc: QTextDocument, images: dict) -> dict[str, str]:
    """Give the document its formula images, centre display formulas, and return each
    image's LaTeX source (what copying gives back)."""
    for name, (image, _formula) in images.items():
        doc.addResource(QTextDocument.ResourceType.ImageResource, QUrl(name), image)
    cursor = QTextCursor(doc)
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            fmt = fragment.charFormat()
            name = fmt.toImageFormat().name() if fmt.isImageFormat() else ""
            if name in images:
                image_format = QTextImageFormat(fmt.toImageFormat())
                image_format.setVerticalAlignment(QTextCharFormat.VerticalAlignment.AlignMiddle)
                cursor.setPosition(fragment.position())
                cursor.setPosition(fragment.position() + 1, QTextCursor.MoveMode.KeepAnchor)
                cursor.setCharFormat(image_format)
                if images[name][1].is_display:
                    centred = block.blockFormat()
                    centred.setAlignment(Qt.AlignmentFlag.AlignHCenter)
                    cursor.setBlockFormat(centred)
            it += 1
        block = block.next()
    return {name: formula.source for name, (_image, formula) in images.items()}


def _mark_quotes(doc: QTextDocument) -> list[tuple[int, int, int]]:
    """Indent block quotes by depth (room for a bar each) and return their runs (first,
    last block number, depth), where the bars are painted."""
    runs: list[tuple[int, int, int]] = []
    cursor = QTextCursor(doc)
    block = doc.begin()
    while block.isValid():
        level = int(block.blockFormat().intProperty(QTextFormat.Property.BlockQuoteLevel))
        if level:
            fmt = block.blockFormat()
            fmt.setLeftMargin(QUOTE_INDENT * level)
            fmt.setRightMargin(0)  # Qt's reader indents both sides by 40 px
            cursor.setPosition(block.position())
            cursor.setBlockFormat(fmt)
            number = block.blockNumber()
            if runs and runs[-1][1] == number - 1 and runs[-1][2] == level:
                runs[-1] = (runs[-1][0], number, level)
            else:
                runs.append((number, number, level))
        block = block.next()
    return runs


def render_plain(text: str, font: QFont) -> RenderedMarkdown:
    """A person's own text as typed: every line break and space kept, no Markdown, since
    `*` or `_` in a question are rarely meant as emphasis."""
    doc = QTextDocument()
    doc.setDefaultFont(font)
    doc.setDocumentMargin(0)
    doc.setPlainText(text)
    cursor = QTextCursor(doc)
    cursor.select(QTextCursor.SelectionType.Document)
    prose = QTextBlockFormat()
    prose.setLineHeight(128, QTextBlockFormat.LineHeightTypes.ProportionalHeight.value)
    cursor.mergeBlockFormat(prose)
    return RenderedMarkdown(doc, [])


def with_draft_markers(text: str, spans: tuple[tuple[int, int], ...]) -> str:
    """`text` with DRAFT_START/DRAFT_END around each span, kept off Markdown syntax that
    only works at a line start (fences, list bullets, headings, quotes) and from beside or
    inside a run of emphasis delimiters (a span shrinks until its ends are clear: the tint
    may miss a character, the emphasis stays). One pass over lines and sorted spans
    together: a long reply has a span every few tokens."""
    taken = set()  # places a marker may not go: a delimiter run's ends and insides
    for run in DELIMITER_RUN.finditer(text):
        taken.update(range(run.start(), run.end() + 1))
    ordered = sorted(spans)
    pieces: list[tuple[int, int]] = []
    line_start, first = 0, 0
    for line in text.splitlines(keepends=True):
        line_end = line_start + len(line.rstrip("\r\n"))
        while first < len(ordered) and ordered[first][1] <= line_start:
            first += 1  # spans wholly before this line are done
        if not FENCE.match(line):
            prefix_end = line_start + BLOCK_PREFIX.match(line).end()
            at = first
            while at < len(ordered) and ordered[at][0] < line_end:
                a, b = max(ordered[at][0], prefix_end), min(ordered[at][1], line_end)
                while a < b and a in taken:
                    a += 1
                while a < b and b in taken:
                    b -= 1
                if a < b:
                    pieces.append((a, b))
                at += 1
        line_start += len(line)
    out, at = [], 0
    for a, b in pieces:
        out += [text[at:a], DRAFT_START, text[a:b], DRAFT_END]
        at = b
    out.append(text[at:])
    return "".join(out)


ASTRAL = re.compile("[\U00010000-\U0010ffff]")  # two UTF-16 units each (most emoji)


def doc_positions(text: str) -> Callable[[int], int]:
    """Index i of `text` (a str: code points) as a QTextDocument position (UTF-16 units),
    for a document whose text starts with `text`: each character past U+FFFF before i
    takes two units there, so "🌟 a"[2] is the document's position 3."""
    astral = [m.start() for m in ASTRAL.finditer(text)]
    if not astral:
        return lambda i: i
    return lambda i: i + bisect.bisect_left(astral, i)


def _tint_marked(doc: QTextDocument, color: QColor) -> bool:
    """Tint each marked span and remove the markers; True if a start marker is left open.
    The raw text's indices become document positions by doc_positions."""
    raw = doc.toRawText()
    at = doc_positions(raw)
    positions = [
        (at(m.start()), m.group()) for m in re.finditer(f"[{DRAFT_START}{DRAFT_END}]", raw)
    ]
    pairs, opened = [], None
    for position, marker in positions:
        if marker == DRAFT_START:
            opened = position
        elif opened is not None:
            pairs.append((opened, position))
            opened = None
    tint = QTextCharFormat()
    tint.setBackground(color)
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()
    for start, end in pairs:  # formats first: no position moves yet
        cursor.setPosition(start + 1)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(tint)
    for position, _marker in reversed(positions):  # then every marker, back to front
        cursor.setPosition(position)
        cursor.deleteChar()
    cursor.endEditBlock()
    return opened is not None


def _style_blocks(doc: QTextDocument, theme: Theme, has_inline_code: bool) -> list[CodeBlock]:
    """Restyle fenced code (margins, colours, highlighting), shade inline code, and loosen
    the line spacing of prose; returns the code blocks for the Copy buttons."""
    groups: list[list] = []
    inline_code = QTextCharFormat()
    inline_code.setBackground(QColor(theme.hover))
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()
    cursor.select(QTextCursor.SelectionType.Document)
    prose = QTextBlockFormat()
    prose.setLineHeight(128, QTextBlockFormat.LineHeightTypes.ProportionalHeight.value)
    cursor.mergeBlockFormat(prose)  # one call for every block; code blocks are reset below
    block, previous_was_code = doc.begin(), False
    while block.isValid():
        is_code = block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence)
        if is_code:
            if not previous_was_code:
                groups.append([])
            groups[-1].append(block)
        elif has_inline_code:
            _shade_inline_code(cursor, block, inline_code)
        previous_was_code = is_code
        block = block.next()
    code_blocks = [_style_code(cursor, group, theme) for group in groups]
    cursor.endEditBlock()
    return code_blocks


def _shade_inline_code(cursor: QTextCursor, block, fmt: QTextCharFormat) -> None:
    # the block's format ranges in one call: walking its fragments cost four calls each,
    # most of a long reply's render (a reply is rendered again at each push while it streams)
    start = block.position()
    for part in block.textFormats():
        if part.format.fontFixedPitch():
            cursor.setPosition(start + part.start)
            cursor.setPosition(start + part.start + part.length, cursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(fmt)


def _style_code(cursor: QTextCursor, group: list, theme: Theme) -> CodeBlock:
    first, last = group[0], group[-1]
    language = str(first.blockFormat().property(QTextFormat.Property.BlockCodeLanguage) or "")
    for block in group:
        fmt = block.blockFormat()
        fmt.setLineHeight(100, QTextBlockFormat.LineHeightTypes.ProportionalHeight.value)
        fmt.setLeftMargin(CODE_INDENT)
        fmt.setRightMargin(CODE_INDENT)
        # Qt's reader keeps a code line whole, which then runs out of its frame and the
        # bubble in a narrow window: wrapped, all of it stays in view (Copy keeps the lines)
        fmt.setNonBreakableLines(False)
        fmt.setTopMargin(CODE_GAP + CODE_HEADER + CODE_PAD if block == first else 0)
        fmt.setBottomMargin(CODE_PAD + 4 + CODE_GAP if block == last else 0)
        cursor.setPosition(block.position())
        cursor.setBlockFormat(fmt)
    code = "\n".join(block.text() for block in group)
    base, at = first.position(), doc_positions(code)
    plain = QTextCharFormat()
    plain.setForeground(QColor(theme.code_text))
    cursor.setPosition(base)
    cursor.setPosition(base + at(len(code)), QTextCursor.MoveMode.KeepAnchor)
    cursor.mergeCharFormat(plain)
    formats: dict[str, QTextCharFormat] = {}
    for start, length, kind in code_spans(code, language):
        if kind not in formats:
            formats[kind] = QTextCharFormat()
            formats[kind].setForeground(QColor(CODE_COLORS[kind]))
            formats[kind].setFontItalic(kind == "comment")
        cursor.setPosition(base + at(start))
        cursor.setPosition(base + at(start + length), QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(formats[kind])
    return CodeBlock(code, language, first.blockNumber(), last.blockNumber())
