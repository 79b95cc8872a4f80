"""Model ▸ Download from Hugging Face…, used as a person does: paste a repo id, pick a
file from the list, download, and the checked file loads (against the loopback hub)."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt

import app.models.hub_dialog as hub_dialog
from engine.events import LoadModel
from tests.app.models.test_hub_download import BIG, Q4, REPO, serve_repos
from tests.app.window.test_window_habits import menu_action


@pytest.fixture
def hub(monkeypatch):
    yield from serve_repos(monkeypatch)


@pytest.fixture
def models(tmp_path, monkeypatch):
    folder = tmp_path / "models"
    monkeypatch.setattr(hub_dialog, "models_dir", lambda: folder)
    return folder


def open_dialog(window, qtbot):
    menu_action(window, "Model", "Download from Hugging Face").trigger()
    dialog = window.hub_dialog
    qtbot.waitUntil(dialog.isVisible)
    return dialog


def find(dialog, qtbot, text: str, rows: int) -> None:
    dialog.source.setFocus()
    qtbot.keyClicks(dialog.source, text)
    qtbot.keyClick(dialog.source, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: dialog.files.topLevelItemCount() == rows, timeout=5000)


def click_row(dialog, qtbot, row: int) -> None:
    item = dialog.files.topLevelItem(row)
    rect = dialog.files.visualItemRect(item)
    qtbot.mouseClick(dialog.files.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def loads(harness) -> list[str]:
    return [c.path for c in harness.engine.commands if isinstance(c, LoadModel)]


def test_paste_pick_download_and_it_loads(harness, qtbot, hub, models):
    window = harness.open()
    dialog = open_dialog(window, qtbot)
    find(dialog, qtbot, REPO, rows=2)
    texts = [[dialog.files.topLevelItem(r).text(c) for c in range(3)] for r in range(2)]
    assert texts[0] == ["tiny.Q4_K_M.gguf", "Q4_K_M", "10.2 kB"]
    assert texts[1][:2] == ["tiny.Q8_0.gguf", "Q8_0"]
    assert not dialog.download_button.isEnabled()
    click_row(dialog, qtbot, 0)
    assert dialog.download_button.isEnabled()
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    target = models / "someone" / "Tiny-GGUF" / "tiny.Q4_K_M.gguf"
    qtbot.waitUntil(lambda: loads(harness) == [str(target)], timeout=5000)
    assert target.read_bytes() == Q4
    assert not dialog.isVisible()
    qtbot.waitUntil(lambda: window.header.name.text() == "Fake-1M")


def test_a_pasted_file_url_selects_that_file(harness, qtbot, hub, models):
    window = harness.open()
    dialog = open_dialog(window, qtbot)
    find(dialog, qtbot, f"https://huggingface.co/{REPO}/blob/main/tiny.Q8_0.gguf", rows=2)
    assert dialog.selected_choice().label == "tiny.Q8_0.gguf"
    assert dialog.download_button.isEnabled()


def test_a_dropped_download_says_so_and_resumes(harness, qtbot, hub, models):
    window = harness.open()
    dialog = open_dialog(window, qtbot)
    find(dialog, qtbot, REPO, rows=2)
    click_row(dialog, qtbot, 0)
    hub.drop_after["tiny.Q4_K_M.gguf"] = 5000
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "dropped" in dialog.message.text(), timeout=5000)
    assert "The part is kept" in dialog.message.text()
    assert dialog.isVisible() and loads(harness) == []
    assert dialog.download_button.text() == "Resume download"

    del hub.drop_after["tiny.Q4_K_M.gguf"]
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    target = models / "someone" / "Tiny-GGUF" / "tiny.Q4_K_M.gguf"
    qtbot.waitUntil(lambda: loads(harness) == [str(target)], timeout=5000)
    assert target.read_bytes() == Q4


def test_a_corrupt_download_is_refused_and_nothing_loads(harness, qtbot, hub, models):
    window = harness.open()
    dialog = open_dialog(window, qtbot)
    find(dialog, qtbot, REPO, rows=2)
    click_row(dialog, qtbot, 0)
    hub.corrupt.add("tiny.Q4_K_M.gguf")
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "corrupt" in dialog.message.text(), timeout=5000)
    assert loads(harness) == []
    assert dialog.download_button.text() == "Download"  # nothing kept to resume


def test_a_bad_repo_id_and_a_missing_repo_get_messages(harness, qtbot, hub, models):
    window = harness.open()
    dialog = open_dialog(window, qtbot)
    dialog.source.setFocus()
    qtbot.keyClicks(dialog.source, "not a repo")
    qtbot.mouseClick(dialog.find_button, Qt.MouseButton.LeftButton)
    assert "repo id" in dialog.message.text()
    dialog.source.clear()
    find(dialog, qtbot, "someone/absent", rows=0)
    qtbot.waitUntil(lambda: "No model repo" in dialog.message.text(), timeout=5000)


def test_the_model_pickers_download_button_opens_it(harness, qtbot, hub, models):
    window = harness.open()
    qtbot.mouseClick(window.header.picker, Qt.MouseButton.LeftButton)
    picker = window.header.picker_dialog
    qtbot.waitUntil(picker.isVisible)
    qtbot.mouseClick(picker.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.hub_dialog is not None and window.hub_dialog.isVisible())
    find(window.hub_dialog, qtbot, REPO, rows=2)
    first = window.hub_dialog
    window.hub_dialog.reject()
    menu_action(window, "Model", "Download from Hugging Face").trigger()
    assert window.hub_dialog is first and first.isVisible()  # the list is still there
    assert first.files.topLevelItemCount() == 2


def test_closing_the_dialog_keeps_the_download_going_and_cancel_stops_it(
    harness,
    qtbot,
    hub,
    models,
):
    window = harness.open()
    dialog = open_dialog(window, qtbot)
    find(dialog, qtbot, "someone/Big-GGUF", rows=1)
    click_row(dialog, qtbot, 0)
    release = threading.Event()
    hub.hold_after["big.Q2_K.gguf"] = (100_000, release)
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.progress.value() > 0, timeout=5000)
    qtbot.mouseClick(dialog.close_button, Qt.MouseButton.LeftButton)
    assert not dialog.isVisible()
    release.set()
    target = models / "someone" / "Big-GGUF" / "big.Q2_K.gguf"
    qtbot.waitUntil(lambda: loads(harness) == [str(target)], timeout=10000)
    assert target.read_bytes() == BIG

    target.unlink()
    menu_action(window, "Model", "Download from Hugging Face").trigger()
    release.clear()
    click_row(dialog, qtbot, 0)
    qtbot.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.progress.value() > 0, timeout=5000)
    assert dialog.cancel_button.isVisible()
    qtbot.mouseClick(dialog.cancel_button, Qt.MouseButton.LeftButton)
    release.set()
    qtbot.waitUntil(lambda: "Cancelled" in dialog.message.text(), timeout=5000)
    assert dialog.download_button.text() == "Resume download"
    assert len(loads(harness)) == 1
