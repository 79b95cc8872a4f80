"""A bad draft model picked in Settings (issue 17 item 3), over the real engine and a tiny
model: the main model stays loaded and answers, the banner says it is the draft model
that failed and why, and the saved draft path is cleared so later loads do not fail on
it (before: the main model was unloaded, every later load failed, "draft" was never
said)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtWidgets import QApplication, QDialogButtonBox

from app.bridge import real_engine
from app.settings.app_settings import load_settings
from app.settings.settings_dialog import SettingsDialog
from engine.config import EngineConfig
from engine.events import Failed


def fill_settings(qtbot, draft: Path) -> None:
    """In the open Settings dialog: Drafter "Draft model", type the path, press OK."""
    dialog = QApplication.activeModalWidget()
    assert isinstance(dialog, SettingsDialog)
    dialog.drafter.setCurrentIndex(dialog.drafter.findData("draft_model"))
    dialog.draft_model_path.clear()
    qtbot.keyClicks(dialog.draft_model_path, str(draft))
    ok = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok)
    qtbot.mouseClick(ok, Qt.MouseButton.LeftButton)


def test_a_corrupt_draft_model_keeps_the_main_model_and_is_cleared(
    harness, qtbot, tiny_llama_gguf, tmp_path: Path
) -> None:
    path, _spec = tiny_llama_gguf
    draft = tmp_path / "broken-draft.gguf"
    draft.write_bytes(Path(path).read_bytes()[:-5000])  # an incomplete download
    window = harness.open(engine_factory=real_engine(EngineConfig(backend="numpy")))
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=60000):
        window.model_loader.load(str(path))
    name = window.header.name.text()
    assert name != "No model loaded"

    QTimer.singleShot(0, lambda: fill_settings(qtbot, draft))
    with qtbot.waitSignal(window.bridge.failed, timeout=60000):
        qtbot.mouseClick(window.header.settings_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(window.banner.isVisible)
    message = window.banner.message.text()
    assert message.startswith("The draft model could not be loaded")
    assert "broken-draft.gguf" in message and "truncated" in message
    assert window.header.name.text() == name  # the main model is still the one loaded
    assert window.settings.draft_model_path == "" and window.settings.drafter == "auto"
    saved = load_settings(QSettings(harness.settings_path, QSettings.Format.IniFormat))
    assert saved.draft_model_path == "" and saved.drafter == "auto"

    window.banner.dismiss_button.click()
    # greedy: a sampled first token of this random tiny model is now and then its EOS
    window.apply_settings(replace(window.settings, temperature=0.0, max_tokens=8))
    harness.send("hello there", wait=False)
    harness.wait_idle(timeout=60000)
    assert not window.banner.isVisible(), window.banner.message.text()
    reply = harness.items()[-1]
    assert reply.role == "assistant" and reply.stats["generated_tokens"] >= 1

    # a later load (here: the same model again) does not try the broken draft again
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=60000) as loaded:
        window.model_loader.load(str(path))
    assert loaded.args[0].draft_error == "" and loaded.args[0].draft_model is None
    assert not window.banner.isVisible()


def test_the_header_shows_the_model_that_answers_after_a_failed_load(harness, qtbot) -> None:
    """The engine says which model is active after a failed load: the header follows it
    (the old model when the new file was refused before the release, none after)."""
    window = harness.open()
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=5000):
        window.model_loader.load("/models/good.gguf")
    name = window.header.name.text()
    assert name != "No model loaded"
    refused = Failed("", "cut.gguf: truncated. Fake-1M is still loaded.", "", "/m/cut.gguf")
    with qtbot.waitSignal(window.bridge.failed, timeout=5000):
        window.bridge._listen(replace(refused, active_model="/models/good.gguf"))
    qtbot.waitUntil(window.banner.isVisible)
    assert window.banner.message.text() == refused.message
    assert window.header.name.text() == name
    with qtbot.waitSignal(window.bridge.failed, timeout=5000):
        window.bridge._listen(replace(refused, message="bad. No model is loaded now."))
    qtbot.waitUntil(lambda: window.header.name.text() == "No model loaded")
