"""LaTeX math in replies, typeset as images: $...$ and \\(...\\) inline, $$...$$ and \\[...\\]
on their own line.

No TeX is installed anywhere we run, and Qt's rich text cannot show MathML, so each
formula is typeset by ziamath (pure Python: LaTeX -> MathML -> SVG with the STIX Two
Math font it ships) and drawn into an image that the message's document shows in place
of the source. Copying the text gives the source back. Limits: what latex2mathml
parses (most of amsmath; no \\begin{tikzpicture}, no macros defined in the reply); a
formula it cannot parse stays as its source, shown as code, never dropped. Inline
images sit centred on the line, not on the text's baseline (Qt aligns images by top,
middle or bottom only).

A lone "$" is not math: as in Pandoc, an opening $ is followed by a non-space, a
closing $ follows a non-space and is not followed by a digit ("$5 and $10" stays text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from PySide6.QtCore import QByteArray, QRectF, Qt
from PySide6.QtGui import QColor, QImage, QPainter

MATH = re.compile(
    r"(?<!\\)\$\$(?P<dd>.+?)\$\$"  # $$ display $$
    r"|\\\[(?P<bd>.+?)\\\]"  # \[ display \]
    r"|\\\((?P<bi>.+?)\\\)"  # \( inline \)
    r"|(?<![\\$\w])\$(?P<di>[^\s$](?:[^$\n]*?[^\s$\\])?)\$(?!\d)",  # $inline$
    re.DOTALL,
)
# Code keeps its dollars: fenced blocks and inline code spans are skipped.
CODE = re.compile(r"(?ms)^[ \t]{0,3}(```|~~~).*?^[ \t]{0,3}\1[^\n]*$|`[^`\n]+`")
SCALE = 2  # images are drawn at twice their size, for sharp text on high-DPI screens


@dataclass(frozen=True)
class Formula:
    start: int  # [start, end) in the message's source
    end: int
    latex: str
    is_display: bool

    @property
    def source(self) -> str:
        return f"$${self.latex}$$" if self.is_display else f"${self.latex}$"


def find_formulas(text: str) -> list[Formula]:
    if "$" not in text and "\\(" not in text and "\\[" not in text:
        return []
    code = [m.span() for m in CODE.finditer(text)]
    out = []
    for match in MATH.finditer(text):
        start, end = match.span()
        if any(a < end and start < b for a, b in code):
            continue
        kind = match.lastgroup or ""
        latex = (match.group(kind) or "").strip()
        if latex:
            out.append(Formula(start, end, latex, is_display=kind in ("dd", "bd")))
    return out


@lru_cache(maxsize=512)
def typeset(latex: str, is_display: bool, size_px: float, color: str) -> QImage | None:
    """The formula as an image (device pixel ratio SCALE), or None when it does not parse."""
    import ziamath  # imported on first use: most replies hold no math

    # SVG 1.1 output: QtSvg renders SVG Tiny 1.2, which has no <symbol>, and ziamath's
    # default SVG 2 draws every glyph through one (the image came out blank but for rules).
    ziamath.config.svg2 = False
    try:
        svg = ziamath.Latex(latex, size=size_px * SCALE, color=color, inline=not is_display).svg()
    except Exception:  # latex2mathml raises its own kinds (and KeyError, IndexError)
        return None
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(QByteArray(svg.encode()))
    if not renderer.isValid():
        return None
    size = renderer.defaultSize()
    image = QImage(max(1, size.width()), max(1, size.height()), QImage.Format.Format_ARGB32)
    image.fill(QColor(Qt.GlobalColor.transparent))
    painter = QPainter(image)
    renderer.render(painter, QRectF(0, 0, size.width(), size.height()))
    painter.end()
    image.setDevicePixelRatio(SCALE)
    return image
