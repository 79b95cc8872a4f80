"""View ▸ Appearance: the window's colours like the system's (and following it when it
changes), or always light, or always dark; the choice is kept for the next start."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QSettings
from PySide6.QtGui import QActionGroup
from PySide6.QtWidgets import QMenu

from app.theme import DARK, LIGHT, Theme, system_theme

if TYPE_CHECKING:
    from app.window.main_window import MainWindow

KEY = "view/appearance"
CHOICES = {"system": "Like the system", "light": "Light", "dark": "Dark"}


def chosen(qsettings: QSettings) -> str:
    value = str(qsettings.value(KEY, "system"))
    return value if value in CHOICES else "system"


def theme_for(choice: str, system: Theme | None = None) -> Theme:
    """The theme a choice means; "system" is `system` where given, else the system's."""
    if choice in ("light", "dark"):
        return LIGHT if choice == "light" else DARK
    return system or system_theme()


def build_appearance_menu(window: MainWindow, menu: QMenu) -> None:
    group = QActionGroup(menu)
    group.setExclusive(True)
    current = chosen(window.qsettings)
    for value, text in CHOICES.items():
        action = menu.addAction(text)
        action.setCheckable(True)
        action.setChecked(value == current)
        group.addAction(action)
        action.triggered.connect(lambda _checked=False, v=value: choose(window, v))


def choose(window: MainWindow, value: str) -> None:
    window.qsettings.setValue(KEY, value)
    window.set_theme(theme_for(value))
