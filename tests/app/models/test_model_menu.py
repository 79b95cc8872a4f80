"""The header's Model menu used the way a person does: open it, pick an entry; the pick
reaches the engine as a LoadModel of that path (issue 17: the entries did nothing)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog

import app.models.model_loader as model_loader
from engine.events import LoadModel


def pick(window, qtbot, label: str) -> None:
    """Open the Model menu (which fills it) and trigger the entry whose text starts with
    `label`."""
    menu = window.header.menu
    menu.popup(window.header.picker.mapToGlobal(window.header.picker.rect().bottomLeft()))
    qtbot.waitUntil(menu.isVisible)
    actions = [a for a in menu.actions() if a.text().startswith(label)]
    assert len(actions) == 1, [a.text() for a in menu.actions()]
    actions[0].trigger()
    menu.hide()


def loaded_paths(harness) -> list[str]:
    return [c.path for c in harness.engine.commands if isinstance(c, LoadModel)]


def test_open_gguf_file_loads_the_file_picked(harness, qtbot, monkeypatch):
    window = harness.open()
    picked = ("/models/picked.gguf", "GGUF (*.gguf)")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *_args, **_kwargs: picked)
    pick(window, qtbot, "Open GGUF file")
    qtbot.waitUntil(lambda: window.header.name.text() == "Fake-1M")
    assert loaded_paths(harness) == ["/models/picked.gguf"]
    assert window.header.toolTip() == "/models/picked.gguf"


def test_open_model_folder_loads_the_folder_picked(harness, qtbot, monkeypatch):
    window = harness.open()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *_a, **_k: "/models/hf")
    pick(window, qtbot, "Open model folder")
    qtbot.waitUntil(lambda: loaded_paths(harness) == ["/models/hf"])


def test_a_cancelled_file_dialog_loads_nothing(harness, qtbot, monkeypatch):
    window = harness.open()
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *_args, **_kwargs: ("", ""))
    pick(window, qtbot, "Open GGUF file")
    qtbot.wait(50)
    assert loaded_paths(harness) == []


@pytest.mark.parametrize("is_present", [True, False])
def test_default_model_loads_it_or_fetches_it_first(harness, qtbot, monkeypatch, is_present):
    window = harness.open()
    default = Path("/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    monkeypatch.setattr(model_loader, "is_default_model_present", lambda: is_present)
    monkeypatch.setattr(model_loader, "default_model_path", lambda: default)
    fetches: list[bool] = []
    monkeypatch.setattr(window.model_loader.fetcher, "start", lambda: fetches.append(True))
    pick(window, qtbot, "Default model")
    if is_present:
        qtbot.waitUntil(lambda: loaded_paths(harness) == [str(default)])
        assert fetches == []
    else:
        assert fetches == [True] and window.header.name.text() == "Default model"
        window.model_loader.fetcher.ready.emit(str(default))  # what a finished fetch sends
        qtbot.waitUntil(lambda: loaded_paths(harness) == [str(default)])


def test_a_recent_model_loads_again(harness, qtbot):
    window = harness.open()
    recent = ("/models/b.gguf", "/models/a.gguf")
    window.apply_settings(replace(window.settings, recent_models=recent))
    pick(window, qtbot, "a.gguf")
    qtbot.waitUntil(lambda: loaded_paths(harness) == ["/models/a.gguf"])
