"""Markdown rendering, highlighting, drafted-token tint and the stats lines."""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QTextCursor

from app.messages.markdown import doc_positions, render, with_draft_markers
from app.theme import CODE_COLORS, LIGHT
from engine.stats_format import compact, live_line, message_line

TEXT = "Some **bold** prose.\n\n```python\ndef f(n):\n    return n  # done\n```\n\n- a list\n"


def char_format_at(doc, position):
    cursor = QTextCursor(doc)
    cursor.setPosition(position + 1)
    return cursor.charFormat()


def test_code_blocks_are_found_and_highlighted(qapp):
    rendered = render(TEXT, LIGHT, QFont("DejaVu Sans", 10))
    assert [(b.text, b.language) for b in rendered.code_blocks] == [
        ("def f(n):\n    return n  # done", "python")
    ]
    doc = rendered.doc
    plain = doc.toPlainText()
    assert plain == "Some bold prose.\ndef f(n):\n    return n  # done\na list"
    keyword = char_format_at(doc, plain.index("def"))
    assert keyword.foreground().color() == QColor(CODE_COLORS["keyword"])
    comment = char_format_at(doc, plain.index("# done"))
    assert comment.foreground().color() == QColor(CODE_COLORS["comment"])


def test_a_long_code_line_wraps_inside_its_frame(qapp):
    line = "return sum(x + y for x, y in zip(numbers, numbers[1:])) " * 3
    rendered = render(f"Text.\n\n```python\n{line.strip()}\n```\n", LIGHT, QFont("DejaVu Sans", 10))
    doc = rendered.doc
    doc.setTextWidth(300)
    (block,) = rendered.code_blocks
    code = doc.findBlockByNumber(block.first_block)
    doc.documentLayout().blockBoundingRect(code)  # laid out now, not at the next paint
    layout = code.layout()
    assert layout.lineCount() > 1
    right = 300 - code.blockFormat().rightMargin()
    for number in range(layout.lineCount()):
        text_line = layout.lineAt(number)
        assert text_line.x() + text_line.naturalTextWidth() <= right + 0.5
    assert block.text == line.strip()  # what Copy takes: the line as written


def test_inline_code_is_shaded_and_nothing_else(qapp):
    """Every character of each inline code span, in prose, a list and a quote, and none
    around them, has the shade's background."""
    text = "Call `f(x)` then **`g`**.\n\n- item `h` end\n\n> quoted `q1` and `q2`"
    doc = render(text, LIGHT, QFont("DejaVu Sans", 10)).doc
    plain = doc.toPlainText()
    shade = QColor(LIGHT.hover)
    shaded = "".join(
        char if char_format_at(doc, i).background().color() == shade else "."
        for i, char in enumerate(plain)
        if char != "\n"
    )
    expected = "".join(
        char if char in "f(x)ghq12" and i in CODE_AT else "."
        for i, char in enumerate(plain.replace("\n", ""))
    )
    assert shaded == expected


CODE_AT = {5, 6, 7, 8, 15, 22, 34, 35, 41, 42}  # f(x), g, h, q1, q2 in the text without \n


def test_drafted_spans_are_tinted_and_the_markers_removed(qapp):
    text = "- first item\n- second item"
    spans = ((0, 7), (15, 21))  # "- first" (bullet included) and "second"
    marked = with_draft_markers(text, spans)
    assert marked == "- \ue000first\ue001 item\n- \ue000second\ue001 item"
    doc = render(text, LIGHT, QFont("DejaVu Sans", 10), spans).doc
    plain = doc.toPlainText()
    assert plain == "first item\nsecond item"
    tint = QColor(LIGHT.drafted)
    assert char_format_at(doc, plain.index("first")).background().color() == tint
    assert char_format_at(doc, plain.index("second")).background().color() == tint
    assert char_format_at(doc, plain.index(" item")).background().color() != tint


def test_stats_lines():
    stats = dict(generated_tokens=41, decode_tok_s=38.2, ttft_s=0.21, drafted=40, accepted=25)
    assert message_line(stats) == "41 tok · 38.2 tok/s · TTFT 0.21 s · 25/40 drafts accepted"
    window_measured = dict(generated_tokens=3, ttft_s=0.5, accepted=2, source="window")
    assert message_line(window_measured) == "3 tok · TTFT 0.50 s · 2 tok from drafts"
    assert message_line(None) == ""
    line = live_line(tok_s=36.9, ttft_s=0.19, acceptance=0.71, context_tokens=4130,
                     context_length=8192)  # fmt: skip
    assert line == "36.9 tok/s · TTFT 0.19 s · 71% of drafts accepted · ctx 4.1k/8k"
    assert compact(512) == "512" and compact(131072) == "128k"


def test_the_figures_tooltip_names_thinking_and_replay():
    from engine.stats_format import message_tooltip

    figures = dict(generated_tokens=9, thinking_tokens=4, reused_tokens=10, prefilled_tokens=20,
                   replayed_tokens=6, drafted=4, accepted=2)  # fmt: skip
    tip = message_tooltip(figures)
    assert "4 of them in the thinking block" in tip
    assert "20 prompt tokens computed (prefilled), 6 of them replayed" in tip
    assert "2 of 4 drafted tokens accepted (50%)" in tip
    assert "2 of this reply's 9 tokens (22%) came from accepted drafts" in tip


def test_a_drafted_span_beside_emphasis_leaves_it_bold(qapp):
    """A marker beside `**` is neither space nor punctuation, so `Fact:**` followed by one
    would not close the bold (the app showed "**Primary Colors and Fact:**" as typed). A
    span stops short of a delimiter run instead, here losing its ":" as well."""
    text = "**Primary Colors and Fact:**\n- Red"
    colors, end = text.index("Colors"), text.index(":**")
    spans = ((colors, colors + 6), (end, end + 3))  # "Colors" and ":**", as drafted
    marked = with_draft_markers(text, spans)
    assert marked == "**Primary \ue000Colors\ue001 and Fact:**\n- Red"  # ":" sits beside "**"
    doc = render(text, LIGHT, QFont("DejaVu Sans", 10), spans).doc
    plain = doc.toPlainText()
    assert plain.startswith("Primary Colors and Fact:\n")
    assert char_format_at(doc, plain.index("Fact")).fontWeight() == QFont.Weight.Bold
    tint = QColor(LIGHT.drafted)
    assert char_format_at(doc, plain.index("Colors")).background().color() == tint


def test_a_drafted_span_after_an_emoji_keeps_every_character(qapp):
    """An emoji (past U+FFFF: two UTF-16 units in the document, one character in Python)
    before a drafted span: the span's tint lies on its own characters, every marker goes
    and no character is lost (the markers' places were off by one per emoji, so a letter
    beside each went and the marker stayed, a box on screen)."""
    text = "Hello! 🌟 I'm here. Is there 😊 anything you'd like to improve?"
    span = text.index(" to")
    doc = render(text, LIGHT, QFont("DejaVu Sans", 10), ((span, span + 3),)).doc
    plain = doc.toPlainText()
    assert plain == text
    tint = QColor(LIGHT.drafted)
    at = doc_positions(plain)
    tinted = [
        i for i in range(len(plain)) if char_format_at(doc, at(i)).background().color() == tint
    ]
    assert tinted == [span, span + 1, span + 2], [plain[i] for i in tinted]


def test_code_after_an_emoji_is_highlighted_where_it_is(qapp):
    text = 'Code:\n\n```python\nstar = "🌟🌟"\nreturn star  # done\n```\n'
    doc = render(text, LIGHT, QFont("DejaVu Sans", 10)).doc
    plain = doc.toPlainText()
    at = doc_positions(plain)
    keyword = char_format_at(doc, at(plain.index("return")))
    assert keyword.foreground().color() == QColor(CODE_COLORS["keyword"])
    comment = char_format_at(doc, at(plain.index("# done")))
    assert comment.foreground().color() == QColor(CODE_COLORS["comment"])
    before = char_format_at(doc, at(plain.index(" star  #")))
    assert before.foreground().color() != QColor(CODE_COLORS["keyword"])
