"""A model without a chat template in the window: the message box says it continues
plain text, and what the person types is sent as a raw continuation."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt

from app.bridge import real_engine
from engine.config import EngineConfig
from engine.tokenizer import Tokenizer
from tests.engine.test_raw_completion import greedy_reference, without_template

TEXT = "Once upon a time, the sea"


def _load(window, qtbot, path) -> None:
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=60000):
        window.model_loader.load(str(path))


def test_a_model_without_a_template_continues_what_is_typed(
    harness, qtbot, tiny_models, tmp_path
) -> None:
    source, spec = tiny_models.hf("llama")
    base = without_template(source, tmp_path / "tiny-base")
    config = EngineConfig.from_environment(backend="numpy")
    window = harness.open(engine_factory=real_engine(config))
    # a system prompt has no place in plain text: it must not reach the model
    settings = replace(window.settings, temperature=0.0, max_tokens=5, system_prompt="Be kind.")
    window.apply_settings(settings)
    _load(window, qtbot, base)
    edit = window.composer.edit
    assert edit.placeholderText().startswith(
        "This model has no chat template: plain text completion."
    )
    qtbot.keyClicks(edit, TEXT)
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    harness.wait_idle(timeout=60000)
    assert not window.banner.isVisible(), window.banner.message.text()
    user, reply = harness.items()
    assert user.content == TEXT
    tokenizer = Tokenizer.from_dir(base)
    expected = greedy_reference(spec, tokenizer.encode(TEXT, add_special=True), 5)
    stop = next((i for i, t in enumerate(expected) if t in tokenizer.eos_ids), 5)
    assert reply.content == tokenizer.decode(expected[:stop])

    _load(window, qtbot, source)  # a chat model again: the box is a message box again
    assert edit.placeholderText().startswith("Message…")
