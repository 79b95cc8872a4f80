"""The memory budget setting (issue 16: one byte budget over the computed state): set in
Settings it reaches the engine as SetMemoryBudget, "Automatic" leaves the engine its
default, the old branch-cache budget a person had changed becomes their memory budget,
and after a reply the status line and its tooltip say what the state holds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtWidgets import QApplication, QDialogButtonBox

from app.bridge import real_engine
from app.settings.app_settings import AppSettings, load_settings, save_settings
from app.settings.settings_dialog import SettingsDialog
from engine.config import EngineConfig
from engine.events import SetMemoryBudget


def set_budget_in_dialog(qtbot, text: str) -> None:
    dialog = QApplication.activeModalWidget()
    assert isinstance(dialog, SettingsDialog)
    box = dialog.memory_budget
    box.setFocus()
    box.selectAll()
    qtbot.keyClicks(box, text)
    ok = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok)
    qtbot.mouseClick(ok, Qt.MouseButton.LeftButton)


def budgets(harness) -> list[int | None]:
    return [c.max_bytes for c in harness.engine.commands if isinstance(c, SetMemoryBudget)]


def test_the_budget_set_in_settings_reaches_the_engine_and_is_kept(harness, qtbot) -> None:
    window = harness.open()
    window.model_loader.load("/models/some.gguf")
    assert budgets(harness) == [None]  # automatic: the engine's own default
    QTimer.singleShot(0, lambda: set_budget_in_dialog(qtbot, "1024"))
    qtbot.mouseClick(window.header.settings_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: budgets(harness) == [None, 1024 << 20])
    assert window.settings.memory_budget_mb == 1024
    window = harness.open()  # reopened: the setting is back and sent with the next load
    assert window.settings.memory_budget_mb == 1024
    window.model_loader.load("/models/some.gguf")
    assert budgets(harness) == [1024 << 20]


def test_the_old_cache_budget_migrates(tmp_path: Path) -> None:
    changed = QSettings(str(tmp_path / "changed.ini"), QSettings.Format.IniFormat)
    changed.setValue("cache_budget_mb", 6144)  # what a person had set
    changed.sync()
    assert load_settings(changed).memory_budget_mb == 6144
    save_settings(changed, load_settings(changed))
    assert changed.value("cache_budget_mb") is None  # migrated: the old key is gone
    assert load_settings(changed).memory_budget_mb == 6144
    untouched = QSettings(str(tmp_path / "default.ini"), QSettings.Format.IniFormat)
    untouched.setValue("cache_budget_mb", 2048)  # the old default: never chosen
    untouched.sync()
    assert load_settings(untouched).memory_budget_mb == 0
    assert AppSettings().memory_budget_bytes is None
    assert AppSettings(memory_budget_mb=512).memory_budget_bytes == 512 << 20


def test_after_a_reply_the_status_line_says_what_the_state_holds(
    harness, qtbot, tiny_llama_gguf
) -> None:
    path, _spec = tiny_llama_gguf
    window = harness.open(engine_factory=real_engine(EngineConfig(backend="numpy")))
    window.apply_settings(replace(window.settings, memory_budget_mb=64, max_tokens=8))
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=60000):
        window.model_loader.load(str(path))
    harness.send("hello there", wait=False)
    harness.wait_idle(timeout=60000)
    status = window.composer.status
    qtbot.waitUntil(lambda: "mem " in status.text())
    assert status.text().endswith("/64 MiB"), status.text()
    tooltip = status.toolTip()
    assert tooltip.startswith("Memory held by the model's computed state")
    assert "live state" in tooltip and "of a 64 MiB budget" in tooltip
