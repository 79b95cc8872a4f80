"""LaTeX in replies is typeset (inline and display), copying gives the source back, a
lone dollar stays a dollar, code keeps its dollars; a block quote gets its bar."""

from __future__ import annotations

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QGuiApplication, QTextDocument

from app.messages.math import find_formulas
from tests.app.messages.ui import open_with_reply

REPLY = (
    "Euler: $e^{i\\pi} + 1 = 0$, and\n\n$$\\int_0^1 x^2\\,dx = \\frac{1}{3}$$\n\n"
    "It costs $5 and $10. Code keeps `$x$`; \\(a^2 + b^2\\) too."
)


def images_in(doc):
    names = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fmt = it.fragment().charFormat()
            if fmt.isImageFormat():
                names.append((fmt.toImageFormat().name(), block))
            it += 1
        block = block.next()
    return names


def test_formulas_are_typeset_and_copy_gives_their_source(harness, qtbot):
    window = open_with_reply(harness, REPLY)
    harness.send("some maths please")
    view = window.chat.list_view
    item = window.controller.model.item(1)
    rendered = window.chat.delegate.rendered(item, view.layout_width())
    doc = rendered.markdown.doc
    images = images_in(doc)
    assert len(images) == 3  # inline Euler, the display integral, \( \) inline
    for name, _block in images:
        image = doc.resource(QTextDocument.ResourceType.ImageResource, QUrl(name))
        assert not image.isNull() and image.width() > 10
        inked = sum(
            image.pixelColor(x, y).alpha() > 128
            for y in range(image.height())
            for x in range(image.width())
        )
        assert inked > image.width() * 2, "the glyphs are drawn, not only the rules"
    display_block = images[1][1]
    assert display_block.blockFormat().alignment() & Qt.AlignmentFlag.AlignHCenter
    plain = doc.toPlainText()
    assert "$5 and $10" in plain and "$x$" in plain and "\\pi" not in plain
    # Select the whole reply from the keyboard and copy: the sources come back.
    view.setFocus()
    qtbot.keyClick(view, Qt.Key.Key_End)
    qtbot.keyClick(view, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClick(view, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    copied = QGuiApplication.clipboard().text()
    assert "$e^{i\\pi} + 1 = 0$" in copied and "$$\\int_0^1 x^2\\,dx = \\frac{1}{3}$$" in copied
    assert "$a^2 + b^2$" in copied and "$5 and $10" in copied


def test_a_formula_that_does_not_parse_stays_as_its_source():
    from PySide6.QtGui import QFont

    from app.messages.markdown import render
    from app.theme import LIGHT

    doc = render("Broken: $\\frac{1}{$ end", LIGHT, QFont("DejaVu Sans", 10)).doc
    assert "$\\frac{1}{$" in doc.toPlainText() and not images_in(doc)


def test_which_dollars_are_math():
    found = [f.latex for f in find_formulas("$x$ costs $5, $ y $, $$z$$ and \\[w\\] $1$2")]
    assert found == ["x", "z", "w"]


def test_a_block_quote_has_a_bar(harness, qtbot):
    window = open_with_reply(harness, "As they say:\n\n> Measure twice,\n>\n> cut once.\n\nIndeed.")
    harness.send("a proverb")
    item = window.controller.model.item(1)
    rendered = window.chat.delegate.rendered(item, window.chat.list_view.layout_width())
    (bar,) = rendered.quote_bars
    doc = rendered.markdown.doc
    plain = doc.toPlainText()
    first, last = (doc.findBlock(plain.index(word)) for word in ("Measure", "cut"))
    layout = doc.documentLayout()
    assert bar.top() <= layout.blockBoundingRect(first).top()
    assert bar.bottom() >= layout.blockBoundingRect(last).bottom()  # both paragraphs
    assert bar.width() == 3 and first.blockFormat().leftMargin() > bar.right()
