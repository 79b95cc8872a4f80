"""The persistent prompt cache through the engine: a conversation's state survives an
engine restart, and a corrupt file or another model's file is ignored (and logged), never
trusted. Replies are compared with a fresh engine's, as in test_engine.py.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from engine import events as ev
from engine.branch_cache import common_prefix
from tests.conftest import TinyModels
from tests.engine.engine_runner import (
    USERS,
    Runner,
    assert_same_reply,
    assistant,
    fresh_finished,
    greedy,
    prompt_ids,
    user,
)

KINDS = ["llama", "hybrid"]

# -- the persistent prompt cache ---------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["close", "save_state"])
def test_disk_cache_survives_an_engine_restart(
    kind: str, how: str, models: dict, tmp_path: Path
) -> None:
    path = models[kind]
    messages: tuple[ev.Message, ...] = ()
    with Runner(cache_dir=tmp_path) as runner:
        runner.load(path)
        for text in USERS[:2]:
            messages += (user(text),)
            messages += (assistant(runner.generate(messages, conversation_id="c1").text),)
        saved = runner.state_tokens()
        if how == "save_state":
            runner.engine.submit(ev.SaveState("c1"))
            event = runner.next_event()
            assert isinstance(event, ev.StateSaved) and event.conversation_id == "c1"
            assert Path(event.path).is_file() and event.num_bytes > 0

    messages += (user(USERS[2]),)
    ids = prompt_ids(messages)
    with Runner(cache_dir=tmp_path) as runner:
        runner.load(path)
        finished = runner.generate(messages, conversation_id="c1")
    assert finished.stats is not None
    reused = finished.stats.reused_tokens
    assert 0 < reused <= common_prefix(saved, ids)
    if kind == "llama":
        assert reused == common_prefix(saved, ids)
    assert_same_reply(finished, fresh_finished(path, messages, greedy()))


def _saved_cache_file(path: Path, cache_dir: Path) -> tuple[Path, tuple[ev.Message, ...]]:
    messages: tuple[ev.Message, ...] = (user(USERS[0]),)
    with Runner(cache_dir=cache_dir) as runner:
        runner.load(path)
        messages += (assistant(runner.generate(messages, conversation_id="c1").text),)
        session = runner.engine.session
        assert session is not None and session.prompt_cache is not None
        cache_file = session.prompt_cache.path_for("c1")
    assert cache_file.is_file()
    return cache_file, (*messages, user(USERS[1]))


def _first_request_reuses_nothing(path: Path, cache_dir: Path, messages: tuple) -> None:
    with Runner(cache_dir=cache_dir) as runner:
        runner.load(path)
        finished = runner.generate(messages, conversation_id="c1")
    assert finished.stats is not None and finished.stats.reused_tokens == 0
    assert_same_reply(finished, fresh_finished(path, messages, greedy()))


def test_corrupt_cache_file_is_ignored(
    models: dict, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache_file, messages = _saved_cache_file(models["llama"], tmp_path)
    data = bytearray(cache_file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the arrays
    cache_file.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="engine.prompt_cache"):
        _first_request_reuses_nothing(models["llama"], tmp_path, messages)
    assert any("ignoring prompt cache file" in r.getMessage() for r in caplog.records)

    cache_file.write_bytes(b"not a safetensors file")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.prompt_cache"):
        _first_request_reuses_nothing(models["llama"], tmp_path, messages)
    assert any(str(cache_file) in r.getMessage() for r in caplog.records)


def test_cache_file_of_another_model_is_ignored(
    models: dict,
    tiny_models: TinyModels,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    other = tiny_models.gguf(qtype="F32", seed=1)[0]
    cache_file, messages = _saved_cache_file(other, tmp_path / "other")
    with Runner(cache_dir=tmp_path) as runner:
        runner.load(models["llama"])
        session = runner.engine.session
        assert session is not None and session.prompt_cache is not None
        target = session.prompt_cache.path_for("c1")
    assert target.parent != cache_file.parent  # each model has its own folder
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(cache_file, target)  # as if the folder names collided
    with caplog.at_level(logging.WARNING, logger="engine.prompt_cache"):
        _first_request_reuses_nothing(models["llama"], tmp_path, messages)
    assert any("another model" in r.getMessage() for r in caplog.records)
