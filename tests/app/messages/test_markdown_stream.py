"""A streamed reply rendered by its tail (markdown_stream.py) is the full render, at every
push: the same HTML and formats, code blocks, quote runs and formulas, and the same
layout. Random replies are built from Markdown pieces and streamed in random chunks, some
cut inside a fence, a `$$` or a list marker; each hazard the tail path guards against
streams as a whole; a long reply is parsed a bounded amount per push; an edit or a branch
switch renders the whole text."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PySide6.QtGui import QColor, QFont, QTextCursor, QTextDocument, QTextFormat

import app.messages.markdown as markdown
from app.conversation.status import MessageStatus
from app.messages.markdown import render
from app.messages.markdown_stream import render_appended
from app.messages.message_model import MessageItem
from app.messages.rendered_message import RenderCache, Rendered
from app.theme import DARK, LIGHT

FONT = QFont("DejaVu Sans", 10)
WIDTH = 560

INLINE = [
    "plain words",
    "**bold**",
    "*italic*",
    "`code`",
    "[a link](https://example.com/x)",
    "$x^2$",
    "$\\alpha + \\beta$",
    "\\(a_1\\)",
    "$5 and $10",
    "a < b",
    "~~gone~~",
    "&amp;",
    "https://example.org",
    "C:\\\\path",
    "`$not math$`",
    "$\\frac{$",  # does not typeset: shown as code
]
BLOCKS = [
    "# Title",
    "## Section two",
    "```python\ndef f(n):\n    return n  # done\n```",
    "```\nplain code\n\nwith a blank line\n```",
    "~~~js\nlet a = `x`;\n~~~",
    "````md\n```\ninner fence\n```\n````",
    "```bash\nunclosed fence",
    "```\nfirst\n```\n\n```\nsecond right after\n```",
    "- one\n- two\n- three",
    "- loose one\n\n- loose two\n\n  continued in the item",
    "1. first\n2. second\n   - nested\n   - items",
    "1. Install:\n   ```bash\n   pip install x\n   ```\n2. Run:\n   ```bash\n   x --go\n   ```",
    "- item with fence\n\n  ```\n  code in item\n\n  more code\n  ```\n\nafter the list",
    "* star item\ncontinued lazily",
    "3. starts at three",
    "> quoted line\n> > nested quote\n> back",
    "> a quote\n\n> another quote",
    "> quote with `code`\nlazy line",
    "| a | b |\n|---|---|\n| 1 | **2** |",
    "col | col\n--- | ---\nx | y",
    "$$x^2 + y^2 = z^2$$",
    "$$\n\\int_0^1 x\\,dx\n$$",
    "$$a\n\nb$$",
    "$$\\frac{$$",  # a display formula that does not typeset: a code block
    "***",
    "---",
    "Setext heading\n===",
    "    indented code\n    more",
    "a line\nwith a soft break",
    "see [ref] here",
    "1",
    "2024. A year",
    "-5 degrees",
    "\\[ a + b \\]",
    # fences a blank line does not end, or that only look like fences
    "  ```\n  a fence indented at the top level\n\nstill code\n  ```",
    "- ```\n  code in the item\n- next item\n```",
    "text\n2. not an item\n   ```\n   code\n\nin the fence?\n   ```",
    "1. step\n\n   ```\n   code\n\nends the item\n   ```",
    "```\nfence with\n```python\nnot a closer\n\nstill code\n```",
    "```a`b\nnot a fence",
    "> ```\n> quoted code\n\n> more\n> ```",
    "\t```\ntab-indented\n\n\t```",
    "~~~~\n~~~\n\nshort closer\n~~~~",
]
# What no cut may follow (markdown_cuts.py), or no head at all (markdown_stream.py)
STOPPERS = [
    "<b>html</b> inline",
    "<div>\nan HTML block\n\nwith a blank line\n</div>",
    "- [ ] a task\n- [x] done",
    "[ref]: https://example.com",
    # lists Qt's reader never closes (no text in them): every block after is indented
    "-",
    "- $$x^2 + y^2 = z^2$$",
    "- ***",
    "- # heading in an item",
    "- [](https://example.com)",
    "> - ",
    "- a\n  -",
    "1.\n   text on the next line",
]
SEPARATORS = ["\n\n"] * 4 + ["\n", "\n\n\n", "\n\n    ", "\n\n  "]


@st.composite
def paragraphs(draw):
    words = draw(st.lists(st.sampled_from(INLINE), min_size=1, max_size=5))
    return " ".join(words) + draw(st.sampled_from([".", "", " and", ":"]))


@st.composite
def replies(draw):
    kinds = [paragraphs(), paragraphs(), st.sampled_from(BLOCKS)]
    if draw(st.booleans()):
        kinds.append(st.sampled_from(STOPPERS))
    pieces = draw(st.lists(st.one_of(kinds), max_size=16))
    text = ""
    for piece in pieces:
        text += piece + draw(st.sampled_from(SEPARATORS))
    return text or "empty"


def tricky_cuts(text: str) -> set[int]:
    """Positions inside a fence marker, a `$$`, a list marker and a blank line."""
    found = set()
    for match in re.finditer(r"```|~~~|\$\$|\n- |\n\d\. |\n\n", text):
        found.update(range(match.start() + 1, match.end()))
    return found


@st.composite
def streams(draw):
    text = draw(replies())
    chosen = draw(st.lists(st.integers(1, len(text)), max_size=25))
    tricky = sorted(tricky_cuts(text))
    if tricky:
        chosen += draw(st.lists(st.sampled_from(tricky), max_size=15))
    ends = sorted(set(chosen) | {len(text)})
    span_edges = draw(st.lists(st.integers(0, len(text)), max_size=12, unique=True))
    edges = sorted(span_edges)
    spans = tuple(zip(edges[::2], edges[1::2], strict=False))
    return text, ends, spans


def spans_so_far(spans, end):
    return tuple((a, min(b, end)) for a, b in spans if a < end)


def properties(fmt) -> QTextFormat:
    """A format, less the index of its list or table (the order Qt made them in, which a
    document edited in place does not share); compared by Qt (`properties()` cannot
    convert every property to Python)."""
    found = QTextFormat(fmt)
    found.clearProperty(QTextFormat.Property.ObjectIndex)
    return found


def formats(doc: QTextDocument) -> list:
    """Every block's formats and its text's, with what toHtml() leaves out (a block's
    marker outside a list, say)."""
    out = []
    block = doc.begin()
    while block.isValid():
        text_list = block.textList()
        out.append((
            block.text(),
            properties(block.blockFormat()),
            properties(block.charFormat()),
            [(r.start, r.length, properties(r.format)) for r in block.textFormats()],
            properties(text_list.format()) if text_list else None,
        ))  # fmt: skip
        block = block.next()
    return out


def assert_same(streamed, full, text):
    assert streamed.doc.toHtml() == full.doc.toHtml(), text
    assert formats(streamed.doc) == formats(full.doc), text
    assert streamed.code_blocks == full.code_blocks, text
    assert streamed.quote_blocks == full.quote_blocks, text
    assert streamed.math_sources == full.math_sources, text
    assert streamed.doc.rootFrame().frameFormat() == full.doc.rootFrame().frameFormat()


def assert_same_layout(streamed: Rendered, full: Rendered, text):
    assert streamed.height == full.height, text
    assert streamed.code_rects == full.code_rects, text
    assert streamed.quote_bars == full.quote_bars, text


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=streams(), tint=st.booleans())
def test_a_reply_streamed_by_its_tail_renders_as_a_whole(qapp, stream, tint):
    text, ends, all_spans = stream
    previous = None
    for end in ends:
        shown = text[:end]
        spans = spans_so_far(all_spans, end) if tint else ()
        streamed, settled = render_appended(shown, LIGHT, FONT, spans, previous)
        full = render(shown, LIGHT, FONT, spans)
        assert_same(streamed, full, shown)
        # laid out as the view does: the document kept (and changed in place) between
        # pushes lays out only what changed
        laid_out = Rendered((shown,), streamed, settled=settled)
        laid_out.wrap(WIDTH, shrink=False)
        whole = Rendered((shown,), full)
        whole.wrap(WIDTH, shrink=False)
        assert_same_layout(laid_out, whole, shown)
        previous = (streamed, settled)


def stream_by_lines(text: str, spans=()):
    """Push `text` a line at a time, then a character at a time, asserting at each push."""
    ends = [m.end() for m in re.finditer(r"\n", text)] + [len(text)]
    for pushes in (ends, range(1, len(text) + 1)):
        previous = None
        for end in pushes:
            shown = text[:end]
            streamed, settled = render_appended(
                shown, LIGHT, FONT, spans_so_far(spans, end), previous
            )
            assert_same(streamed, render(shown, LIGHT, FONT, spans_so_far(spans, end)), shown)
            previous = (streamed, settled)


AFTER = "\n\nAfter it.\n\nMore text.\n\nThe end.\n"
# Each text streams wrong without the safeguard its name gives (checked by disabling each).
HAZARDS = {
    "table after code (a flag left from the code block)": "```\ncode\n```\n\n"
    "| a | b |\n|---|---|\n| 1 | 2 |" + AFTER,
    "table after a quote": "> quoted\n\n| a | b |\n|---|---|\n| 1 | 2 |" + AFTER,
    "fence right under a table's row (md4c reads it as a row)": "| a | b |\n|---|---|\n"
    "| 1 | **2** |\n```python\ndef f(n):\n    return n  # done\n```" + AFTER,
    "rule and table after code": "```\ncode\n```\n\n***\n\n| a | b |\n|---|---|\n| 1 | 2 |" + AFTER,
    "rule last in the head (an empty block)": "Text.\n\n***" + AFTER,
    "table last in the head (an empty block after it)": "| a | b |\n|---|---|\n| 1 | 2 |" + AFTER,
    "task item (its checkbox kept)": "- [x] done" + AFTER,
    "list item with no text (its list never closed)": "-" + AFTER,
    "unclosed HTML tag": "Some <b>bold" + AFTER,
    "fence with a blank line": "```\ncode\n\nmore code\n```" + AFTER,
    "fence closed only without info": "```\ncode\n```python\n\nstill code\n```" + AFTER,
    "fence in a possibly lazy item": "text\n2. not an item\n   ```\n   code\n\nin the fence\n   ```"
    + AFTER,
    "code after code at the seam": "```\ncode\n```\n\n$$\\frac{$$" + AFTER,
    "formula across a cut": "$$a\n\nb$$" + AFTER,
    "formula closed after the head": "Costs $$5" + AFTER + "and $$ more.\n",
    "code span for formulas closed after the head": "```a`b\n\n$x$" + AFTER + "```\n",
    "link definition after the head": "See [ref] here." + AFTER + "[ref]: https://example.com\n",
    "front matter closed after the head": "---\ntitle: x" + AFTER + "---\n\nMore.\n",
}


@pytest.mark.parametrize("text", HAZARDS.values(), ids=HAZARDS.keys())
def test_a_hazard_streams_as_a_whole(qapp, text):
    stream_by_lines(text)


def test_a_drafted_span_left_open_streams_as_a_whole(qapp):
    """A span from a link's text into its URL loses its end marker to the URL, and the
    next span, from a URL into text, its start: the whole pairs the two across a cut."""
    text = (
        "Intro.\n\nSee [the docs](https://example.com/docs) now."
        "\n\nThen [more](https://example.org/page) ok." + AFTER
    )
    spans = (
        (text.index("docs]"), text.index("://example.com")),
        (text.index("example.org"), text.index(" ok.") + 3),
    )
    stream_by_lines(text, spans)
    whole = render(text, LIGHT, FONT, spans).doc
    cursor = QTextCursor(whole)
    cursor.setPosition(whole.toPlainText().index("Then") + 1)
    assert cursor.charFormat().background().color() == QColor(LIGHT.drafted)  # one tint


def test_drafted_spans_changed_in_the_head_render_whole(qapp):
    text = "First paragraph here." + AFTER
    head, _ = render_appended(text[:40], LIGHT, FONT, ((0, 5),), None)
    previous = render_appended(text[:50], LIGHT, FONT, ((0, 5),), (head, None))
    assert previous[1] is not None
    streamed, _ = render_appended(text, LIGHT, FONT, ((6, 15),), previous)
    assert_same(streamed, render(text, LIGHT, FONT, ((6, 15),)), text)


def test_the_stream_takes_the_tail_path(qapp):
    """A cut in every paragraph: the head settles and the streamed render is the full one
    (the property above could pass with every push rendered whole)."""
    text = "".join(f"Paragraph {i} with `code` and **bold**.\n\n" for i in range(40))
    previous = None
    for end in range(20, len(text), 37):
        streamed, settled = render_appended(text[:end], LIGHT, FONT, (), previous)
        assert_same(streamed, render(text[:end], LIGHT, FONT), text[:end])
        previous = (streamed, settled)
    assert settled is not None and settled.num_chars > len(text) - 200


PIECES = ["The", " quick", " **brown**", " fox", " jumps", " over", " `lazy`", " dogs.", "\n\n"]


class CountingDocument(QTextDocument):
    parsed: list[int] = []

    def setMarkdown(self, text, *args):  # noqa: N802 (Qt's name)
        CountingDocument.parsed.append(len(text))
        super().setMarkdown(text, *args)


def reply(content: str) -> MessageItem:
    return MessageItem("reply", "assistant", content, MessageStatus.STREAMING)


def test_a_long_reply_is_parsed_a_bounded_amount_per_push(qapp, monkeypatch):
    monkeypatch.setattr(markdown, "QTextDocument", CountingDocument)
    CountingDocument.parsed = []
    cache = RenderCache()
    text = "".join(PIECES[i % len(PIECES)] for i in range(3000))
    step = 40  # characters a push: ~8 tokens
    per_push = []
    for end in range(step, len(text) + step, step):
        CountingDocument.parsed.clear()
        entry = cache.get(reply(text[:end]), WIDTH, LIGHT, FONT, tint=False)
        per_push.append(sum(CountingDocument.parsed))
    assert len(text) > 15_000
    assert max(per_push[3:]) < 400, "a push parsed more than the reply's last paragraphs"
    assert_same(entry.markdown, render(text, LIGHT, FONT), "")
    whole = Rendered((text,), render(text, LIGHT, FONT))
    whole.wrap(WIDTH, shrink=False)
    assert_same_layout(entry, whole, "")


def test_an_edit_or_a_branch_switch_renders_whole(qapp, monkeypatch):
    monkeypatch.setattr(markdown, "QTextDocument", CountingDocument)
    cache = RenderCache()
    text = "".join(f"Paragraph {i} of the reply.\n\n" for i in range(30))
    for end in (200, 400, len(text)):
        cache.get(reply(text[:end]), WIDTH, LIGHT, FONT, tint=False)
    changes = {
        "an edit": text.replace("Paragraph 3 ", "Paragraph three "),
        "a branch switch": "Another branch's reply.\n\n" + text[:300],
        "a shorter text": text[:500],
        "the theme": text + "More.",
    }
    for change, changed in changes.items():
        CountingDocument.parsed = []
        theme = DARK if change == "the theme" else LIGHT
        entry = cache.get(reply(changed), WIDTH, theme, FONT, tint=False)
        assert CountingDocument.parsed == [len(changed)], change
        assert entry.settled is None, change
        assert_same(entry.markdown, render(changed, theme, FONT), change)
