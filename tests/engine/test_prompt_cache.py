"""The prompt cache switched on: a ~2k-token chat survives an engine restart (the next
message reuses the saved state, and its reply equals a fresh engine's), the state is on
disk soon after a reply without waiting for a close, written once while unchanged, and
saved when the engine switches conversation; a truncated or corrupt file, or another
model's, is refused and re-prefilled through the engine, never loaded."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from engine import engine as engine_module
from engine import events as ev
from engine import prompt_cache as prompt_cache_module
from engine.branch_cache import common_prefix
from engine.config import EngineConfig
from engine.loader import load_model
from engine.prompt_cache import PromptCache
from engine.state import SnapshotPolicy
from tests.conftest import TinyModels
from tests.engine.engine_runner import (
    TIMEOUT,
    USERS,
    Runner,
    assert_same_reply,
    assistant,
    fresh_finished,
    greedy,
    prompt_ids,
    user,
)
from tests.engine.state_reference import assert_next_logits_exact
from tests.hybrid_models import make_hybrid_dir

KINDS = ["llama", "hybrid"]
TEXT = "the sea and the sky are blue because light scatters in the air over water"
WORDS = TEXT.split()


@pytest.fixture(scope="module")
def long_models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny Llama and hybrid with room for a 2k-token chat."""
    hybrid = tmp_path_factory.mktemp("long_hybrid") / "hybrid"
    make_hybrid_dir(hybrid, "hf", max_position_embeddings=4096)
    llama = tiny_models.gguf(qtype="F32", max_position_embeddings=4096)[0]
    return {"llama": llama, "hybrid": hybrid}


def prose(num_words: int, start: int) -> str:
    return " ".join(WORDS[(start + 7 * i) % len(WORDS)] for i in range(num_words))


def long_chat() -> tuple[ev.Message, ...]:
    """Four user/assistant turns and a last question: ~2,000 tokens on the tiny tokenizer."""
    messages: tuple[ev.Message, ...] = ()
    for turn in range(4):
        messages += (user(prose(80, turn)), assistant(prose(80, 50 + turn)))
    return (*messages, user("Last question: " + prose(20, 99)))


def wait_for(condition, what: str) -> None:
    """Waits for something the engine thread does on its own (not a timing assertion)."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def cache_file(runner: Runner, conversation_id: str) -> Path:
    session = runner.engine.session
    assert session is not None and session.prompt_cache is not None
    return session.prompt_cache.path_for(conversation_id)


@pytest.mark.parametrize("kind", KINDS)
def test_a_restart_answers_the_next_message_from_the_saved_state(
    kind: str, long_models: dict, tmp_path: Path
) -> None:
    path, chat = long_models[kind], long_chat()
    num_asked = len(prompt_ids(chat))
    assert 1900 <= num_asked <= 2300
    with Runner(cache_dir=tmp_path) as runner:
        runner.load(path)
        first = runner.generate(chat, conversation_id="c1")
        saved = runner.state_tokens()
    chat += (assistant(first.text), user(USERS[2]))
    ids = prompt_ids(chat)
    with Runner(cache_dir=tmp_path) as runner:
        runner.load(path)
        finished = runner.generate(chat, conversation_id="c1")
    assert finished.stats is not None
    shared = common_prefix(saved, ids)
    # the whole first prompt at least (a random model's reply may re-tokenize otherwise)
    assert shared >= num_asked
    reused = finished.stats.reused_tokens
    # a hybrid resumes from the saved state's last snapshot at or before the fork
    assert shared - (0 if kind == "llama" else SnapshotPolicy().stride) <= reused <= shared
    assert finished.stats.prefilled_tokens == len(ids) - reused
    assert_same_reply(finished, fresh_finished(path, chat, greedy()))

    # the file the second engine resumed from holds exactly a fresh prefill's numbers
    loaded = load_model(path, EngineConfig(backend="numpy", prompt_cache_dir=str(tmp_path)))
    state = PromptCache(tmp_path, loaded.fingerprint).load("c1", loaded.runner)
    assert state is not None and common_prefix(state.tokens, ids) >= shared
    assert_next_logits_exact(loaded.model, state)


@pytest.mark.parametrize("kind", KINDS)
def test_a_reply_is_on_disk_once_the_engine_is_idle(
    kind: str, long_models: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No close needed: a second engine started while the first still runs (as after a
    crash of the first) resumes from the state the reply left."""
    monkeypatch.setattr(engine_module, "AUTOSAVE_IDLE_S", 0.05)
    path = long_models[kind]
    messages: tuple[ev.Message, ...] = (user(USERS[0]),)
    with Runner(cache_dir=tmp_path) as first:
        first.load(path)
        reply = first.generate(messages, conversation_id="c1")
        wait_for(cache_file(first, "c1").is_file, "the idle save")
        live = first.state_tokens()
        messages += (assistant(reply.text), user(USERS[1]))
        with Runner(cache_dir=tmp_path) as second:
            second.load(path)
            finished = second.generate(messages, conversation_id="c1")
    assert finished.stats is not None and finished.stats.reused_tokens > 0
    if kind == "llama":
        assert finished.stats.reused_tokens == common_prefix(live, prompt_ids(messages))
    assert_same_reply(finished, fresh_finished(path, messages, greedy()))


def test_an_unchanged_state_is_written_once(
    long_models: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "AUTOSAVE_IDLE_S", 0.05)
    written: list[int] = []
    save_state = prompt_cache_module.save_state

    def counting(state, path, fingerprint):  # type: ignore[no-untyped-def]
        written.append(state.offset)
        return save_state(state, path, fingerprint)

    monkeypatch.setattr(prompt_cache_module, "save_state", counting)
    with Runner(cache_dir=tmp_path) as runner:
        runner.load(long_models["llama"])
        runner.generate((user(USERS[0]),), conversation_id="c1")
        wait_for(lambda: written, "the idle save")
        runner.engine.submit(ev.SaveState("c1"))  # the file holds this state already
        saved = runner.next_event()
        assert isinstance(saved, ev.StateSaved) and Path(saved.path).is_file()
    assert len(written) == 1  # neither the explicit save nor the close wrote it again


def test_switching_conversation_saves_the_one_left(
    long_models: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "AUTOSAVE_IDLE_S", 3600.0)  # only the switch saves
    with Runner(cache_dir=tmp_path) as runner:
        runner.load(long_models["llama"])
        runner.generate((user(USERS[0]),), conversation_id="c1")
        left = runner.state_tokens()
        assert not cache_file(runner, "c1").exists()
        runner.generate((user(USERS[1]),), conversation_id="c2")
        c1 = cache_file(runner, "c1")
        assert c1.is_file()
        loaded = load_model(long_models["llama"], EngineConfig(backend="numpy"))
        state = PromptCache(tmp_path, loaded.fingerprint).load("c1", loaded.runner)
        assert state is not None and state.tokens == left


def spoiled(data: bytes, case: str, other_model_file: bytes) -> bytes:
    """A saved file as a crash mid-copy, a full disk, bit rot or a folder mix-up leave it."""
    header = 8 + int.from_bytes(data[:8], "little")
    flipped = bytearray(data)
    flipped[header + (len(data) - header) // 2] ^= 0x10  # inside the arrays
    return {
        "cut in half": data[: len(data) // 2],
        "cut in the header": data[: header // 2],
        "a flipped byte": bytes(flipped),
        "another model's": other_model_file,
    }[case]


CASES = ["cut in half", "cut in the header", "a flipped byte", "another model's"]


@pytest.fixture(scope="module")
def other_models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each kind's sibling with other random weights (same shapes, same tokenizer)."""
    hybrid = tmp_path_factory.mktemp("other_hybrid") / "hybrid"
    make_hybrid_dir(hybrid, "hf", max_position_embeddings=4096, seed=7)
    llama = tiny_models.gguf(qtype="F32", max_position_embeddings=4096, seed=7)[0]
    return {"llama": llama, "hybrid": hybrid}


def saved_file(path: Path, cache_dir: Path, messages: tuple[ev.Message, ...]) -> Path:
    with Runner(cache_dir=cache_dir) as runner:
        runner.load(path)
        runner.generate(messages, conversation_id="c1")
        file = cache_file(runner, "c1")
    return file


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_spoiled_file_is_refused_and_prefilled_afresh(
    kind: str,
    case: str,
    long_models: dict,
    other_models: dict,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = long_models[kind]
    messages: tuple[ev.Message, ...] = (user(USERS[0]),)
    other = saved_file(other_models[kind], tmp_path / "other", messages).read_bytes()
    saved = saved_file(path, tmp_path, messages)
    saved.write_bytes(spoiled(saved.read_bytes(), case, other))
    messages += (assistant("Fine."), user(USERS[1]))
    with Runner(cache_dir=tmp_path) as runner, caplog.at_level(logging.WARNING):
        runner.load(path)
        finished = runner.generate(messages, conversation_id="c1")
        assert not saved.exists() or saved.read_bytes() != other  # removed, never trusted
    assert any("ignoring prompt cache file" in r.getMessage() for r in caplog.records)
    assert finished.stats is not None and finished.stats.reused_tokens == 0
    assert finished.stats.prefilled_tokens == len(prompt_ids(messages))
    assert_same_reply(finished, fresh_finished(path, messages, greedy()))
