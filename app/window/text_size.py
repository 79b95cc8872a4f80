"""The chat's text size (View ▸ Larger text, Smaller text, Actual size): steps of one point
from the system's size, for the messages and the message box, kept in Settings
(AppSettings.text_size) so the window opens with it. The message list lays its rows out
again on a new font (growing_list.MessageListView.changeEvent)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from PySide6.QtGui import QFont
from PySide6.QtWidgets import QApplication

from app.settings.app_settings import TEXT_SIZES

if TYPE_CHECKING:
    from app.window.main_window import MainWindow


def apply_text_size(window: MainWindow, step: int) -> None:
    """The messages and the message box at the system's size plus `step` points."""
    size = QApplication.font().pointSizeF() + step
    for widget in (window.chat.list_view, window.composer.edit):
        font = QFont(widget.font())
        font.setPointSizeF(size)
        widget.setFont(font)


def change_text_size(window: MainWindow, by: int | None) -> None:
    """One step larger (1) or smaller (-1), within TEXT_SIZES; None: the system's size."""
    step = 0 if by is None else min(max(window.settings.text_size + by, TEXT_SIZES[0]),
                                    TEXT_SIZES[-1])  # fmt: skip
    if step != window.settings.text_size:
        window.save_settings(replace(window.settings, text_size=step))
    apply_text_size(window, step)
