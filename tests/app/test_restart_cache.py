"""Reopening the app on a chat answers the next message from the state saved when the
window closed (the prompt cache the entry point switches on), not by prefilling the chat
again; BRANCHCHAT_PROMPT_CACHE moves it or turns it off."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import app.__main__ as entry
from app.bridge import real_engine
from engine.config import EngineConfig, default_prompt_cache_dir
from engine.events import Message
from tests.engine.engine_runner import fresh_finished, greedy, prompt_ids, user


def open_with_model(harness, qtbot, config: EngineConfig, model: Path):
    window = harness.open(engine_factory=real_engine(config))
    window.restore_session()  # the chat left open, as python -m app reopens it
    with qtbot.waitSignal(window.bridge.model_loaded, timeout=60000):
        window.model_loader.load(str(model))
    window.apply_settings(replace(window.settings, temperature=0.0, max_tokens=12))
    return window


def test_reopening_the_app_answers_from_the_saved_state(
    harness, qtbot, tiny_llama_gguf, tmp_path: Path
) -> None:
    model = tiny_llama_gguf[0]
    config = EngineConfig(backend="numpy", prompt_cache_dir=str(tmp_path / "prompt-cache"))
    window = open_with_model(harness, qtbot, config, model)
    harness.send("hello there", wait=False)
    harness.wait_idle(timeout=60000)
    chat_id = window.controller.conversation_id
    first_reply = harness.items()[-1]
    assert first_reply.stats["reused_tokens"] == 0

    harness.close()  # quitting the app: the engine saves the chat's state
    assert list((tmp_path / "prompt-cache").glob("*/*.safetensors"))
    window = open_with_model(harness, qtbot, config, model)
    assert window.controller.conversation_id == chat_id
    harness.send("tell me more", wait=False)
    harness.wait_idle(timeout=60000)
    assert not window.banner.isVisible(), window.banner.message.text()
    reply = harness.items()[-1]
    assert reply.stats["reused_tokens"] >= len(prompt_ids((user("hello there"),)))
    messages = tuple(Message(item.role, item.content) for item in harness.items()[:-1])
    assert reply.content == fresh_finished(model, messages, greedy(max_tokens=12)).text


@pytest.mark.parametrize(
    ("variable", "expected"),
    [(None, default_prompt_cache_dir({})), ("off", None), ("/tmp/elsewhere", "/tmp/elsewhere")],
)
def test_the_entry_point_switches_the_prompt_cache_on(
    monkeypatch: pytest.MonkeyPatch, variable: str | None, expected: str | None
) -> None:
    if variable is None:
        monkeypatch.delenv("BRANCHCHAT_PROMPT_CACHE", raising=False)
    else:
        monkeypatch.setenv("BRANCHCHAT_PROMPT_CACHE", variable)
    seen: list[EngineConfig] = []
    monkeypatch.setattr(entry, "run_app", lambda args, config: seen.append(config) or 0)
    monkeypatch.setattr(entry, "missing_display_message", lambda: None)
    monkeypatch.setattr(entry.system_check, "check_xcb", lambda: None)
    assert entry.main([]) == 0
    assert seen[0].prompt_cache_dir == expected
