"""App tests run offscreen, against a FakeEngine unless they say otherwise."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtCore import QSettings  # noqa: E402

from app.bridge import EngineBridge  # noqa: E402
from app.conversation.store import ConversationStore  # noqa: E402
from app.theme import LIGHT  # noqa: E402
from app.window.main_window import MainWindow  # noqa: E402
from tests.app.fake_engine import FakeEngine  # noqa: E402


class Harness:
    """Opens (and reopens) the main window over one database and settings file."""

    def __init__(self, qtbot, tmp_path) -> None:
        self.qtbot = qtbot
        self.db_path = tmp_path / "conversations.sqlite3"
        self.settings_path = str(tmp_path / "settings.ini")
        self.window: MainWindow | None = None
        self.engine: FakeEngine | None = None
        self.store: ConversationStore | None = None

    def open(self, engine_factory=None, *, with_model: bool = True) -> MainWindow:
        """`with_model`: the controller takes a model as loaded (the controller refuses to
        send without one), while the header and the recent models stay as a fresh start
        has them; False opens the window as it is before any model loads."""
        self.close()
        self.store = ConversationStore(self.db_path)

        def fake(listener):
            self.engine = FakeEngine(listener)
            return self.engine

        bridge = EngineBridge(engine_factory or fake)
        qsettings = QSettings(self.settings_path, QSettings.Format.IniFormat)
        window = MainWindow(self.store, bridge, qsettings, theme=LIGHT)
        if with_model:
            window.controller.model_name = "Fake-1M"
        window.resize(1000, 700)
        window.show()
        self.qtbot.addWidget(window)
        self.window = window
        return window

    def close(self) -> None:
        if self.window is not None:
            self.window.close()
            self.window = None
        if self.store is not None:
            self.store.close()
            self.store = None

    # -- helpers ----------------------------------------------------------------------

    def texts(self) -> list[str]:
        assert self.window is not None
        return [item.content for item in self.window.controller.model.items]

    def items(self):
        assert self.window is not None
        return self.window.controller.model.items

    def wait_idle(self, timeout: int = 5000) -> None:
        assert self.window is not None
        window = self.window
        self.qtbot.waitUntil(lambda: not window.controller.is_busy, timeout=timeout)

    def send(self, text: str, wait: bool = True) -> None:
        assert self.window is not None
        self.window.composer.edit.setPlainText(text)
        self.window.composer.send_button.click()
        if wait:
            self.wait_idle()


@pytest.fixture
def harness(qtbot, tmp_path):
    h = Harness(qtbot, tmp_path)
    yield h
    h.close()
