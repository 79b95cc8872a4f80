"""`python -m engine chat` and `generate` with the prompt cache: a chat left with Ctrl+D
and resumed with --resume answers its next message from the saved state; the flags and
BRANCHCHAT_PROMPT_CACHE say where it lives, or turn it off."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import __main__ as entry
from engine import events as ev
from engine.branch_cache import common_prefix
from engine.config import default_prompt_cache_dir
from tests.engine.engine_runner import USERS, assistant, prompt_ids, user

STATS = re.compile(r"\[(\d+) prompt tokens \((\d+) reused\)")


def typed(monkeypatch: pytest.MonkeyPatch, lines: list[str]) -> None:
    """The person types `lines` at the chat prompt, then Ctrl+D."""
    feed: Iterator[str] = iter(lines)

    def fake_input(prompt: str = "") -> str:
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)


def chat(model: Path, cache: Path, *flags: str) -> None:
    argv = ["chat", "--model", str(model), "--backend", "numpy", "--prompt-cache", str(cache)]
    assert entry.main([*argv, "--max-tokens", "8", *flags]) == 0


def test_a_resumed_chat_answers_from_the_saved_state(
    tiny_llama_gguf, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    model = tiny_llama_gguf[0]
    typed(monkeypatch, [USERS[0]])
    chat(model, tmp_path)
    first = capsys.readouterr()
    ((asked, reused),) = STATS.findall(first.err)
    assert int(reused) == 0
    kept = json.loads((tmp_path / "terminal-chat.json").read_text())["messages"]
    assert [m["role"] for m in kept] == ["user", "assistant"]
    assert kept[0]["content"] == USERS[0] and kept[1]["content"] in first.out
    reply = kept[1]["content"]

    typed(monkeypatch, [USERS[1]])
    chat(model, tmp_path, "--resume")
    second = capsys.readouterr()
    assert "resumed the last chat: 2 messages" in second.err
    ((asked2, reused2),) = STATS.findall(second.err)
    ids = prompt_ids((user(USERS[0]), assistant(reply), user(USERS[1])))
    assert int(asked2) == len(ids)
    assert int(reused2) >= int(asked)  # the whole first prompt came from the saved state


def test_without_the_cache_nothing_is_written(
    tiny_llama_gguf, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    typed(monkeypatch, [USERS[0]])
    chat(tiny_llama_gguf[0], tmp_path, "--no-prompt-cache")
    assert list(tmp_path.iterdir()) == []
    typed(monkeypatch, [])
    argv = ["chat", "--model", str(tiny_llama_gguf[0]), "--backend", "numpy", "--resume"]
    assert entry.main([*argv, "--no-prompt-cache"]) == 2
    assert "--resume needs the prompt cache" in capsys.readouterr().err


def test_generate_resumes_from_the_last_run_with_its_system_prompt(
    tiny_llama_gguf, tmp_path: Path, capsys
) -> None:
    system = "You answer in one word. " * 8
    argv = ["generate", "--model", str(tiny_llama_gguf[0]), "--backend", "numpy"]
    argv += ["--prompt-cache", str(tmp_path), "--system", system, "--max-tokens", "4"]
    assert entry.main([*argv, "--prompt", USERS[0]]) == 0
    assert entry.main([*argv, "--prompt", USERS[1]]) == 0
    runs = STATS.findall(capsys.readouterr().err)
    ids = [prompt_ids((ev.Message("system", system), user(text))) for text in USERS[:2]]
    # the second run resumes from the first's state: everything up to the question
    assert [int(reused) for _, reused in runs] == [0, common_prefix(ids[0], ids[1])]
    assert common_prefix(ids[0], ids[1]) > 40


def test_where_the_cache_lives() -> None:
    assert default_prompt_cache_dir({"BRANCHCHAT_PROMPT_CACHE": "off"}) is None
    assert default_prompt_cache_dir({"BRANCHCHAT_PROMPT_CACHE": "/x/y"}) == "/x/y"
    default = default_prompt_cache_dir({})
    assert default is not None and default.endswith("prompt-cache") and "branchchat" in default
