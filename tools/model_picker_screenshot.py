"""docs/model-picker.png: the model picker over the window, with the shipped model, two
recent entries that exist (a tiny MLX folder written for it) and one that was moved, and
a load in progress. Run under a display:

    xvfb-run -a .venv/bin/python -m tools.model_picker_screenshot
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

from app.bridge import EngineBridge
from app.conversation.store import ConversationStore
from app.theme import LIGHT, apply_theme
from app.window.main_window import MainWindow
from engine.default_model import default_model_path
from engine.events import ModelLoading
from tests.app.fake_engine import FakeEngine
from tests.tiny_models import make_hf_dir


def main(out: str = "docs/model-picker.png") -> None:
    app = QApplication(sys.argv)
    apply_theme(app, LIGHT)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = root / "Qwen3-tiny-MLX-4bit"
        make_hf_dir(folder, "qwen3", bits=4)
        store = ConversationStore(root / "db.sqlite3")
        qsettings = QSettings(str(root / "settings.ini"), QSettings.Format.IniFormat)
        window = MainWindow(store, EngineBridge(FakeEngine), qsettings, theme=LIGHT)
        recent = (str(folder), str(Path.home() / "Downloads/Llama-3.2-1B-Instruct-Q4_K_M.gguf"))
        window.settings = window.settings.with_recent_model(recent[1])
        window.settings = window.settings.with_recent_model(recent[0])
        window.resize(1100, 720)
        window.show()
        picker = window.header.open_picker()
        picker.resize(620, 420)
        picker.select(folder.name)
        picker.show_loading(ModelLoading(str(default_model_path()), "reading weights", 0.42))
        for _ in range(20):
            app.processEvents()
        picker.grab().save(out)
        window.close()
        store.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
