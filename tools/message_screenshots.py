"""docs/screenshot.png (the window), docs/branches.png (a reply's branch navigator) and
docs/message-stats.png (a reply's footer with its figures' tooltip), from a real run of
the app on the default model in a fresh data folder. Run under a display:

    xvfb-run -a -s "-screen 0 1400x1300x24" .venv/bin/python -m tools.message_screenshots
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QEvent, QPoint, QRect, QSettings
from PySide6.QtGui import QGuiApplication, QHelpEvent
from PySide6.QtWidgets import QApplication, QToolTip

from app.bridge import EngineBridge, real_engine
from app.conversation.store import ConversationStore
from app.theme import LIGHT, apply_theme
from app.window.main_window import MainWindow
from engine.config import EngineConfig
from engine.default_model import default_model_path

QUESTIONS = (
    "Plan a three-day trip to Porto, one line per day.",
    "Which day has the best food? One sentence.",
)


def wait(app: QApplication, done, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not get there in time")
        app.processEvents()
        time.sleep(0.01)


def send(app: QApplication, window: MainWindow, text: str) -> None:
    window.composer.edit.setPlainText(text)
    window.composer.send_button.click()
    wait(app, lambda: window.controller.is_busy)
    wait(app, lambda: not window.controller.is_busy)


def row_rect(window: MainWindow, row: int) -> QRect:
    view = window.chat.list_view
    return view.visualRect(window.controller.model.index(row))


def main(out_dir: str = "docs") -> None:
    app = QApplication(sys.argv)
    apply_theme(app, LIGHT)
    out = Path(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = ConversationStore(root / "db.sqlite3")
        qsettings = QSettings(str(root / "settings.ini"), QSettings.Format.IniFormat)
        config = EngineConfig.from_environment(prompt_cache_dir=root / "cache")
        window = MainWindow(store, EngineBridge(real_engine(config)), qsettings, theme=LIGHT)
        window.apply_settings(replace(window.settings, max_tokens=256, temperature=0.7))
        window.resize(1200, 800)
        window.show()
        window.model_loader.load(str(default_model_path()))
        wait(app, lambda: window.controller.model_name is not None)
        send(app, window, QUESTIONS[0])
        view = window.chat.list_view
        view.activate(window.controller.model.item(1).id, "regenerate")  # a second branch
        wait(app, lambda: window.controller.is_busy)
        wait(app, lambda: not window.controller.is_busy)
        send(app, window, QUESTIONS[1])
        view.scroll_to_bottom()
        for _ in range(30):
            app.processEvents()
        window.grab().save(str(out / "screenshot.png"))

        # The navigator of the regenerated reply, with the pointer on its left arrow.
        view.scrollTo(window.controller.model.index(1))
        for _ in range(10):
            app.processEvents()
        index = window.controller.model.index(1)
        geometry, _ = view.delegate.geometry(view.visualRect(index), index)
        view.delegate.hover_pos = geometry.nav_prev.center()
        view.viewport().update()
        for _ in range(10):
            app.processEvents()
        top = row_rect(window, 1).top()
        area = QRect(0, max(0, top), view.viewport().width(), min(260, geometry.height))
        view.viewport().grab(area).save(str(out / "branches.png"))
        view.delegate.hover_pos = None

        # The last reply's footer, with the tooltip that says what each figure means
        # (the window made taller first, so the tooltip lies over it, not the desktop).
        window.resize(1200, 1250)
        last = window.controller.model.rowCount() - 1
        view.scroll_to_bottom()
        for _ in range(10):
            app.processEvents()
        index = window.controller.model.index(last)
        geometry, _ = view.delegate.geometry(view.visualRect(index), index)
        point = QPoint(geometry.stats.x() + 40, geometry.stats.center().y())
        viewport = view.viewport()
        QApplication.sendEvent(
            viewport, QHelpEvent(QEvent.Type.ToolTip, point, viewport.mapToGlobal(point))
        )
        wait(app, QToolTip.isVisible, 5)
        for _ in range(20):
            app.processEvents()
        tip = next(w for w in QApplication.topLevelWidgets() if w.inherits("QTipLabel"))
        message = QRect(viewport.mapToGlobal(geometry.header.topLeft()), geometry.footer.size())
        message.setBottom(viewport.mapToGlobal(geometry.footer.bottomLeft()).y())
        area = message.united(tip.geometry()).adjusted(-12, -12, 12, 12)
        screen = QGuiApplication.primaryScreen()
        shot = screen.grabWindow(0, area.x(), area.y(), area.width(), area.height())
        shot.save(str(out / "message-stats.png"))
        window.close()
        store.close()
    print(f"wrote {out}/screenshot.png, branches.png, message-stats.png")


if __name__ == "__main__":
    main(*sys.argv[1:])
