"""The application's icon (resources/branchchat.svg, with PNG renderings for the sizes
a window manager asks for), for the window and the freedesktop launcher."""

from __future__ import annotations

from PySide6.QtGui import QIcon

from app.theme import RESOURCES

ICON_SVG = RESOURCES / "branchchat.svg"
PNG_SIZES = (32, 48, 128, 256)  # resources/branchchat-<n>.png, rendered from the SVG


def app_icon() -> QIcon:
    icon = QIcon()
    for size in PNG_SIZES:
        png = RESOURCES / f"branchchat-{size}.png"
        if png.is_file():
            icon.addFile(str(png))
    if ICON_SVG.is_file():  # sharp at every other size, where Qt's SVG plugin is present
        icon.addFile(str(ICON_SVG))
    return icon
