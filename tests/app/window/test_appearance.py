"""View ▸ Appearance: Light and Dark recolour the whole window at once (the application's
palette, the chat, the sidebar), "Like the system" goes back to the system's colours, and
the choice comes back at the next start."""

from __future__ import annotations

from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from app.theme import DARK, LIGHT, system_theme
from tests.app.window.test_window_habits import menu_action


def appearance(window, text: str):
    submenu = menu_action(window, "View", "Appearance").menu()
    [action] = [a for a in submenu.actions() if a.text() == text]
    return action


def painted_window_colour() -> str:
    return QApplication.instance().palette().color(QPalette.ColorRole.Window).name()


def test_appearance_recolours_the_window_and_is_kept(harness):
    window = harness.open()
    assert appearance(window, "Like the system").isChecked()
    appearance(window, "Dark").trigger()
    assert window.theme is DARK and window.chat.delegate.theme is DARK
    assert window.sidebar.list.itemDelegate().theme is DARK
    assert painted_window_colour() == DARK.window.lower()
    assert appearance(window, "Dark").isChecked() and not appearance(window, "Light").isChecked()

    window = harness.open()  # the next start: dark again, though the system's is light
    assert window.theme is DARK and window.chat.delegate.theme is DARK
    assert painted_window_colour() == DARK.window.lower()
    assert appearance(window, "Dark").isChecked()
    appearance(window, "Light").trigger()
    assert window.theme is LIGHT and painted_window_colour() == LIGHT.window.lower()
    appearance(window, "Like the system").trigger()
    assert window.theme is system_theme()
    window = harness.open()
    assert appearance(window, "Like the system").isChecked() and window.theme is LIGHT
