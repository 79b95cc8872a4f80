"""Light and dark colour sets. Widgets take theirs from resources/style.qss (filled in from
a Theme); the message delegate paints with the Theme directly."""

from __future__ import annotations

import site
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from string import Template

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

# a checkout's resources/; an installed wheel's copy (pyproject's data-files), under the
# environment's prefix or, after `pip install --user`, the user base
_CHECKOUT_RESOURCES = Path(__file__).resolve().parent.parent / "resources"
RESOURCES = next(
    (
        folder
        for folder in (
            _CHECKOUT_RESOURCES,
            Path(sys.prefix) / "share" / "branchchat",
            Path(site.getuserbase()) / "share" / "branchchat",
        )
        if folder.is_dir()
    ),
    _CHECKOUT_RESOURCES,
)


@dataclass(frozen=True)
class Theme:
    name: str
    window: str
    sidebar: str
    surface: str  # the assistant's bubble
    user_bubble: str
    border: str
    text: str
    muted: str
    accent: str
    accent_text: str
    hover: str
    selection: str
    code_bg: str  # code blocks stay dark in both themes
    code_header: str
    code_text: str
    drafted: str  # background tint of tokens that came from accepted drafts
    warning: str
    error_bg: str
    error_border: str
    error_text: str
    info_bg: str
    info_border: str

    def color(self, name: str) -> QColor:
        return QColor(getattr(self, name))


LIGHT = Theme(
    name="light",
    window="#ffffff",
    sidebar="#f5f6f8",
    surface="#f6f7f9",
    user_bubble="#e7efff",
    border="#e2e5ea",
    text="#1d2125",
    muted="#6b7280",
    accent="#2563eb",
    accent_text="#ffffff",
    hover="#e9ebef",
    selection="#dfe6f5",
    code_bg="#0f141b",
    code_header="#1a2029",
    code_text="#e6edf3",
    drafted="#3d10b981",
    warning="#b45309",
    error_bg="#fef2f2",
    error_border="#fecaca",
    error_text="#991b1b",
    info_bg="#eff6ff",
    info_border="#bfdbfe",
)

DARK = Theme(
    name="dark",
    window="#1d1e21",
    sidebar="#161719",
    surface="#26282c",
    user_bubble="#263a5c",
    border="#2f3237",
    text="#e6e7e9",
    muted="#9aa0a8",
    accent="#5b9bff",
    accent_text="#0b1220",
    hover="#2a2c31",
    selection="#2c3a52",
    code_bg="#0d1117",
    code_header="#161b22",
    code_text="#e6edf3",
    drafted="#5534d399",
    warning="#f59e0b",
    error_bg="#3a1d1f",
    error_border="#6b2a2e",
    error_text="#fecaca",
    info_bg="#1b2a40",
    info_border="#2c4a75",
)

# Syntax colours for code blocks (GitHub dark), keyed by the highlighter's token classes.
CODE_COLORS = {
    "keyword": "#ff7b72",
    "string": "#a5d6ff",
    "comment": "#8b949e",
    "number": "#79c0ff",
    "name": "#d2a8ff",
    "builtin": "#ffa657",
    "operator": "#ff7b72",
    "decorator": "#ffa657",
}


def system_theme() -> Theme:
    scheme = QGuiApplication.styleHints().colorScheme()
    return DARK if scheme == Qt.ColorScheme.Dark else LIGHT


def style_sheet(theme: Theme) -> str:
    template = Template((RESOURCES / "style.qss").read_text(encoding="utf-8"))
    return template.substitute(asdict(theme))


def apply_theme(app: QApplication, theme: Theme) -> None:
    """Fusion + a palette + the style sheet: the same look on every platform."""
    app.setStyle("Fusion")
    palette = QPalette()
    roles = {
        QPalette.ColorRole.Window: theme.window,
        QPalette.ColorRole.Base: theme.window,
        QPalette.ColorRole.AlternateBase: theme.surface,
        QPalette.ColorRole.Text: theme.text,
        QPalette.ColorRole.WindowText: theme.text,
        QPalette.ColorRole.ButtonText: theme.text,
        QPalette.ColorRole.Button: theme.surface,
        QPalette.ColorRole.Highlight: theme.accent,
        QPalette.ColorRole.HighlightedText: theme.accent_text,
        QPalette.ColorRole.PlaceholderText: theme.muted,
        QPalette.ColorRole.ToolTipBase: theme.surface,
        QPalette.ColorRole.ToolTipText: theme.text,
        QPalette.ColorRole.Link: theme.accent,
    }
    for role, color in roles.items():
        palette.setColor(role, QColor(color))
    # setColor(role, ...) sets every group: greyed widgets would look live without this
    greyed = (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText)
    for role in greyed:
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(theme.muted))
    app.setPalette(palette)
    app.setStyleSheet(style_sheet(theme))
