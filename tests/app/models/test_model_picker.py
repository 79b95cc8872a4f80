"""The model picker used the way a person does: click the header's Model button (or press
Ctrl+L), read each model's size, family, quantization and context, pick one with a click
or the keyboard; the pick reaches the engine as a LoadModel of that path, the load's
progress shows in the picker and the picker closes once the model is loaded."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QFileDialog

import app.models.model_loader as model_loader
from app.models.model_info import SHIPPED_MODELS, read_model_info
from engine.events import LoadModel, ModelLoading


@pytest.fixture(autouse=True)
def close_pickers(harness):
    """A picker left open would keep the keyboard focus from the next test's window."""
    yield
    if harness.window is not None and harness.window.header.picker_dialog is not None:
        harness.window.header.picker_dialog.reject()


def open_picker(window, qtbot):
    qtbot.mouseClick(window.header.picker, Qt.MouseButton.LeftButton)
    picker = window.header.picker_dialog
    assert picker is not None
    qtbot.waitUntil(picker.isVisible)
    return picker


def loaded_paths(harness) -> list[str]:
    return [c.path for c in harness.engine.commands if isinstance(c, LoadModel)]


def with_recent(window, *paths) -> None:
    window.apply_settings(replace(window.settings, recent_models=tuple(str(p) for p in paths)))


def test_each_model_shows_its_size_family_quantization_and_context(
    harness, qtbot, tiny_models, tmp_path
):
    window = harness.open()
    gguf, _ = tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")
    folder, _ = tiny_models.hf("qwen3", bits=4)
    with_recent(window, gguf, folder, tmp_path / "gone.gguf")
    picker = open_picker(window, qtbot)
    rows = picker.entry_rows()
    assert rows[0][0] == "SmolLM2-135M-Instruct"
    assert rows[0][1].startswith("llama · Q4_1 · 98 MB · 8k ctx")
    assert rows[1][0] == "Gemma 3 270M (base)"  # the second shipped model
    assert rows[1][1].startswith("gemma3 · Q4_K_M · 253 MB · 32k ctx")
    size = read_model_info(gguf).num_bytes
    assert rows[2] == (gguf.name, f"llama · Q4_1 · {size / 1e3:.0f} kB · 512 ctx")
    assert rows[3][0] == folder.name and rows[3][1].startswith("qwen3 · 4-bit · ")
    assert rows[4] == ("gone.gguf", "not found (moved or deleted?)")
    picker.select("gone.gguf")
    assert not picker.load_button.isEnabled()  # a missing file cannot be picked


def test_a_recent_model_loads_with_its_progress_and_the_picker_closes(harness, qtbot, tiny_models):
    window = harness.open()
    gguf, _ = tiny_models.gguf(qtype="F32")
    with_recent(window, gguf)
    picker = open_picker(window, qtbot)
    picker.select(gguf.name)
    seen: list[str] = []
    window.bridge.model_loading.connect(lambda _e: seen.append(picker.status.text()))
    qtbot.mouseClick(picker.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.header.name.text() == "Fake-1M")
    assert loaded_paths(harness) == [str(gguf)]
    assert seen == [f"Loading {gguf.name}: reading weights"]  # the fake engine's one stage
    assert window.header.picker_dialog is None  # closed once loaded
    picker = open_picker(window, qtbot)  # opened again: the model in use is marked and picked
    recent = len(SHIPPED_MODELS)  # the first row past the shipped models
    assert picker.list.currentItem().text() == f"{gguf.name}\n{picker.entry_rows()[recent][1]}"
    assert picker.entry_rows()[recent][1].endswith(" · loaded")


def test_ctrl_l_opens_the_picker_and_the_keyboard_picks(harness, qtbot, tiny_models):
    window = harness.open()
    gguf, _ = tiny_models.gguf(qtype="F32")
    with_recent(window, gguf)
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is not None)
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: window.header.picker_dialog is not None)
    picker = window.header.picker_dialog
    picker.list.setFocus()
    for _ in SHIPPED_MODELS:  # from the first shipped model down to the recent file
        qtbot.keyClick(picker.list, Qt.Key.Key_Down)
    assert picker.list.currentItem().text().startswith(gguf.name)
    qtbot.keyClick(picker.list, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: loaded_paths(harness) == [str(gguf)])


def test_progress_events_show_in_the_picker(harness, qtbot):
    window = harness.open()
    picker = open_picker(window, qtbot)
    window.header.show_loading(ModelLoading("/m/x.gguf", "dequantizing", 0.25))
    assert picker.status.text() == "Loading x.gguf: dequantizing"
    assert picker.progress.value() == 250 and not picker.progress.isHidden()


def test_open_file_loads_the_file_picked(harness, qtbot, monkeypatch):
    window = harness.open()
    picked = ("/models/picked.gguf", "GGUF (*.gguf)")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *_args, **_kwargs: picked)
    picker = open_picker(window, qtbot)
    qtbot.mouseClick(picker.open_file_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.header.name.text() == "Fake-1M")
    assert loaded_paths(harness) == ["/models/picked.gguf"]
    assert window.header.toolTip() == "/models/picked.gguf"


def test_open_folder_loads_the_folder_picked(harness, qtbot, monkeypatch):
    window = harness.open()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *_a, **_k: "/models/hf")
    picker = open_picker(window, qtbot)
    qtbot.mouseClick(picker.open_folder_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: loaded_paths(harness) == ["/models/hf"])


def test_a_cancelled_file_dialog_loads_nothing(harness, qtbot, monkeypatch):
    window = harness.open()
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *_args, **_kwargs: ("", ""))
    picker = open_picker(window, qtbot)
    qtbot.mouseClick(picker.open_file_button, Qt.MouseButton.LeftButton)
    qtbot.wait(50)
    assert loaded_paths(harness) == [] and picker.isVisible()


def test_download_opens_the_hugging_face_dialog(harness, qtbot):
    window = harness.open()
    picker = open_picker(window, qtbot)
    qtbot.mouseClick(picker.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.hub_dialog is not None and window.hub_dialog.isVisible())
    assert window.hub_dialog.windowTitle() == "Download from Hugging Face"
    window.hub_dialog.reject()


def test_the_model_menu_opens_the_picker(harness, qtbot):
    window = harness.open()
    model_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Model")
    choose = next(a for a in model_menu.actions() if a.text() == "Choose a model…")
    choose.trigger()
    assert window.header.picker_dialog is not None and window.header.picker_dialog.isVisible()


@pytest.mark.parametrize("is_present", [True, False])
def test_the_shipped_model_loads_or_is_fetched_first(harness, qtbot, monkeypatch, is_present):
    window = harness.open()
    default = Path("/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    monkeypatch.setattr(model_loader, "is_default_model_present", lambda: is_present)
    monkeypatch.setattr(model_loader, "default_model_path", lambda: default)
    fetches: list[bool] = []
    monkeypatch.setattr(window.model_loader.fetcher, "start", lambda: fetches.append(True))
    picker = open_picker(window, qtbot)
    picker.select("SmolLM2-135M-Instruct")
    at = picker.list.visualItemRect(picker.list.currentItem()).center()
    # a double-click as a mouse makes it: a press and release, then the double-click
    qtbot.mouseClick(picker.list.viewport(), Qt.MouseButton.LeftButton, pos=at)
    qtbot.mouseDClick(picker.list.viewport(), Qt.MouseButton.LeftButton, pos=at)
    if is_present:
        qtbot.waitUntil(lambda: loaded_paths(harness) == [str(default)])
        assert fetches == []
    else:
        assert fetches == [True] and window.header.name.text() == "Default model"
        window.model_loader.fetcher.ready.emit(str(default))  # what a finished fetch sends
        qtbot.waitUntil(lambda: loaded_paths(harness) == [str(default)])
