"""The engine thread end to end: commands in, events out, on tiny llama and hybrid models.

Every request's tokens are compared with a FRESH engine given the same branch (greedy,
float32), so reuse, rollback and caching can only ever change speed, never text. The
helpers here (`Runner`, `prompt_ids`, `fresh_finished`) are shared with test_session.py.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pytest

from engine import events as ev
from engine import session as session_module
from engine.branch_cache import common_prefix
from engine.config import EngineConfig
from engine.decoding import CostModel
from engine.engine import Engine
from engine.sampling import SamplingSettings
from tests.conftest import TinyModels
from tests.hybrid_models import make_hybrid_dir
from tests.tiny_models import CHAT_TEMPLATE, build_hf_tokenizer

TIMEOUT = 60.0  # seconds to wait for one event before calling the engine hung
GREEDY = SamplingSettings(temperature=0.0)
USERS = ("Hello there, who are you?", "Tell me about the sea and the sky.", "Why is it blue?")

# -- helpers shared with test_session.py ------------------------------------------------


def greedy(drafter: str = "off", max_tokens: int = 24, **kwargs: Any) -> ev.GenerationSettings:
    return ev.GenerationSettings(GREEDY, max_tokens=max_tokens, drafter=drafter, **kwargs)


def user(text: str) -> ev.Message:
    return ev.Message("user", text)


def assistant(text: str) -> ev.Message:
    return ev.Message("assistant", text)


_TOKENIZER = build_hf_tokenizer()
_TEMPLATE = jinja2.Environment().from_string(CHAT_TEMPLATE)


def prompt_ids(
    messages: tuple[ev.Message, ...], add_generation_prompt: bool = True, continued: str = ""
) -> list[int]:
    """The tiny models' prompt for messages, rendered and tokenized without the engine;
    `continued` is the start of the reply, appended to the text (continue_last)."""
    dicts = [{"role": m.role, "content": m.content} for m in messages]
    text = _TEMPLATE.render(messages=dicts, add_generation_prompt=add_generation_prompt)
    return list(_TOKENIZER.encode(text + continued, add_special_tokens=False).ids)


class Runner:
    """Drives one Engine from the test thread: submit a command, collect its events."""

    def __init__(self, backend: str = "numpy", cache_dir: Path | None = None) -> None:
        self.events: queue.Queue[ev.Event] = queue.Queue()
        self.on_event: Callable[[Runner, ev.Event], None] | None = None  # on the engine thread
        self.engine = Engine(
            self._listen, config=EngineConfig(backend=backend), cache_dir=cache_dir
        )
        self._count = 0

    def _listen(self, event: ev.Event) -> None:
        if self.on_event is not None:
            self.on_event(self, event)
        self.events.put(event)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.engine.close()
        assert not self.engine.is_alive

    def next_event(self) -> ev.Event:
        return self.events.get(timeout=TIMEOUT)

    def load(self, path: Path | str) -> ev.ModelLoaded:
        self.engine.submit(ev.LoadModel(str(path)))
        while True:
            event = self.next_event()
            if isinstance(event, ev.Failed):
                raise AssertionError(f"loading {path} failed: {event.message}")
            if isinstance(event, ev.ModelLoaded):
                return event

    def request(self, command: ev.Generate) -> list[ev.Event]:
        """Every event of one request, up to and including its Finished or Failed."""
        self.engine.submit(command)
        events: list[ev.Event] = []
        while True:
            event = self.next_event()
            assert getattr(event, "request_id", None) == command.request_id, event
            events.append(event)
            if isinstance(event, ev.Finished | ev.Failed):
                return events

    def generate(
        self,
        messages: tuple[ev.Message, ...],
        settings: ev.GenerationSettings | None = None,
        conversation_id: str = "",
    ) -> ev.Finished:
        self._count += 1
        command = ev.Generate(f"req-{self._count}", messages, settings or greedy(), conversation_id)
        last = self.request(command)[-1]
        assert isinstance(last, ev.Finished), last
        return last

    def state_tokens(self) -> list[int]:
        """The live state's tokens; read only while the engine is idle between requests."""
        session = self.engine.session
        return [] if session is None else list(session.state.tokens)


def fresh_finished(
    path: Path | str,
    messages: tuple[ev.Message, ...],
    settings: ev.GenerationSettings,
    backend: str = "numpy",
) -> ev.Finished:
    """What a brand-new engine replies to this branch, without speculation."""
    with Runner(backend) as runner:
        runner.load(path)
        return runner.generate(messages, dataclasses.replace(settings, drafter="off"))


def assert_same_reply(got: ev.Finished, want: ev.Finished) -> None:
    assert got.token_ids == want.token_ids
    assert got.text == want.text
    assert got.reason == want.reason


def build_models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> dict:
    hybrid = tmp_path_factory.mktemp("engine_hybrid") / "hybrid"
    make_hybrid_dir(hybrid, "hf")
    return {"llama": tiny_models.gguf(qtype="F32")[0], "hybrid": hybrid}


def always_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verifying any number of rows costs one step, so every request drafts the longest
    proposal it can (measured costs would make the choice depend on the machine's load)."""
    monkeypatch.setattr(CostModel, "cost", lambda self, rows: 1.0)


@pytest.fixture(scope="session")
def models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return build_models(tiny_models, tmp_path_factory)


KINDS = ["llama", "hybrid"]

# -- stop ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_stop_during_prefill_keeps_exactly_the_chunks_done(
    kind: str, models: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module, "PREFILL_CHUNK", 16)
    messages = (user(" ".join(USERS * 4)),)
    ids = prompt_ids(messages)
    progress: list[ev.PrefillProgress] = []

    def stop_on_first_chunk(runner: Runner, event: ev.Event) -> None:
        if isinstance(event, ev.PrefillProgress):
            progress.append(event)
            if event.done > 0 and len(progress) == 2:
                runner.engine.submit(ev.Stop(event.request_id))

    with Runner() as runner:
        runner.load(models[kind])
        runner.on_event = stop_on_first_chunk
        events = runner.request(ev.Generate("long", messages, greedy()))
        runner.on_event = None
        finished = events[-1]
        assert isinstance(finished, ev.Finished)
        assert (finished.reason, finished.text, finished.token_ids) == ("stopped", "", ())
        assert not any(isinstance(e, ev.Tokens) for e in events)
        done = progress[-1].done
        assert 0 < done <= 16 < len(ids)
        tokens = runner.state_tokens()
        assert tokens == ids[: len(tokens)]
        assert len(tokens) == done  # a fresh engine: nothing reused, the first chunk kept
        assert finished.stats is not None and finished.stats.prefilled_tokens == done

        # the same request again picks up where the stopped prefill ended
        again = runner.generate(messages)
        assert again.stats is not None and again.stats.reused_tokens == done
        assert_same_reply(again, fresh_finished(models[kind], messages, greedy()))


@pytest.mark.parametrize("kind", KINDS)
def test_stop_during_decode_then_continue(kind: str, models: dict) -> None:
    messages = (user(USERS[0]),)
    ids = prompt_ids(messages)
    num_tokens_events = 0

    def stop_after_three(runner: Runner, event: ev.Event) -> None:
        nonlocal num_tokens_events
        if isinstance(event, ev.Tokens) and event.token_ids:
            num_tokens_events += 1
            if num_tokens_events == 3:
                runner.engine.submit(ev.Stop(event.request_id))

    with Runner() as runner:
        runner.load(models[kind])
        runner.on_event = stop_after_three
        events = runner.request(ev.Generate("s", messages, greedy(max_tokens=40)))
        runner.on_event = None
        finished = events[-1]
        assert isinstance(finished, ev.Finished) and finished.reason == "stopped"
        emitted = [t for e in events if isinstance(e, ev.Tokens) for t in e.token_ids]
        assert list(finished.token_ids) == emitted and len(emitted) == 3
        assert finished.text == "".join(e.text for e in events if isinstance(e, ev.Tokens))
        for e in events:
            if isinstance(e, ev.Tokens) and e.token_ids:  # each token's share of the text
                assert len(e.pieces) == len(e.token_ids) and "".join(e.pieces) == e.text
        # decoding.py's invariant: the last emitted token is pending, not in the state
        assert runner.state_tokens() == ids + emitted[:-1]
        full = fresh_finished(models[kind], messages, greedy(max_tokens=40))
        assert list(full.token_ids[:3]) == emitted

        branch = (*messages, assistant(finished.text))
        cont = greedy(max_tokens=12, continue_last=True)
        held = runner.state_tokens()
        continued = runner.generate(branch, cont)
        assert continued.stats is not None
        continue_ids = prompt_ids(messages, continued=finished.text)
        assert continued.stats.prompt_tokens == len(continue_ids)
        reachable = common_prefix(held, continue_ids)
        assert reachable >= len(ids)  # at least the prompt
        if kind == "llama":
            assert continued.stats.reused_tokens == reachable
        else:  # the snapshot at the end of the user message, or all that matched
            assert continued.stats.reused_tokens in (
                len(prompt_ids(messages, add_generation_prompt=False)),
                min(reachable, len(held)),
            )
        assert_same_reply(continued, fresh_finished(models[kind], branch, cont))


def test_close_stops_the_running_request_and_skips_queued_ones(models: dict) -> None:
    """Closing the window mid-reply must not wait for the reply (or the queue) to finish."""
    messages = (user(USERS[0]),)
    started = threading.Event()

    def note_first_tokens(runner: Runner, event: ev.Event) -> None:
        if isinstance(event, ev.Tokens) and event.token_ids and not started.is_set():
            started.set()  # then hold the reply here until close() has begun
            assert runner.engine._closing.wait(TIMEOUT)

    runner = Runner()
    runner.load(models["llama"])
    runner.on_event = note_first_tokens
    runner.engine.submit(ev.Generate("long", messages, greedy(max_tokens=100_000)))
    runner.engine.submit(ev.Generate("queued", messages, greedy(max_tokens=100_000)))
    assert started.wait(TIMEOUT)
    t0 = time.perf_counter()
    runner.close()
    assert time.perf_counter() - t0 < 5.0
    events = []
    while not runner.events.empty():
        events.append(runner.events.get())
    finished = [e for e in events if isinstance(e, ev.Finished)]
    assert [(e.request_id, e.reason) for e in finished] == [("long", "stopped")]
    assert not any(getattr(e, "request_id", "") == "queued" for e in events)


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


# -- context limit ---------------------------------------------------------------------------


def test_context_overflow_fails_clearly_then_drop_oldest_turns_fits(models: dict) -> None:
    long_text = "The sea is blue and the sky is wide. " * 14  # ~ 210 tokens
    messages = (
        user(long_text),
        assistant("Indeed."),
        user(long_text),
        assistant("Yes."),
        user("And the stars?"),
    )
    assert len(prompt_ids(messages)) > 512 > len(prompt_ids(messages[2:]))  # tiny llama's context
    with Runner() as runner:
        runner.load(models["llama"])
        events = runner.request(ev.Generate("too-long", messages, greedy()))
        assert len(events) == 1 and isinstance(events[0], ev.Failed)
        message = events[0].message
        assert f"needs {len(prompt_ids(messages))} tokens" in message
        assert "holds 512" in message and "drop the oldest turns" in message

        short = (user(USERS[0]),)
        assert_same_reply(runner.generate(short), fresh_finished(models["llama"], short, greedy()))

        # a prompt that fits, with a reply that would not: it stops at the context's end
        near = (user("The sea is blue and the sky is wide. " * 20),)
        num_near = len(prompt_ids(near))
        assert 512 - 24 < num_near < 512
        finished = runner.generate(near, greedy(max_tokens=24))
        assert finished.reason == "length" and len(finished.token_ids) == 512 - num_near
        assert_same_reply(finished, fresh_finished(models["llama"], near, greedy(max_tokens=24)))

        dropping = greedy(drop_oldest_turns=True)
        finished = runner.generate(messages, dropping)
        kept = messages[2:]
        assert finished.stats is not None
        assert finished.stats.prompt_tokens == len(prompt_ids(kept))
        assert_same_reply(finished, fresh_finished(models["llama"], kept, greedy()))


# -- threads, failures, event types ---------------------------------------------------------


def test_commands_from_several_threads(models: dict) -> None:
    branches = [(user(text),) for text in USERS]
    want = {
        i: fresh_finished(models["llama"], b, greedy(max_tokens=8)) for i, b in enumerate(branches)
    }
    received: dict[str, list[ev.Event]] = {}
    done = threading.Event()
    lock = threading.Lock()
    num_requests = 12

    def listen(event: ev.Event) -> None:
        rid = getattr(event, "request_id", None)
        if rid is None:
            return
        with lock:
            received.setdefault(rid, []).append(event)
            ended = sum(
                isinstance(e, ev.Finished | ev.Failed) for es in received.values() for e in es
            )
        if ended == num_requests:
            done.set()

    engine = Engine(listen, config=EngineConfig(backend="numpy"))
    engine.submit(ev.LoadModel(str(models["llama"])))
    start = threading.Barrier(4)

    def client(n: int) -> None:
        start.wait()
        for j in range(3):
            i = (n + j) % len(branches)
            engine.submit(ev.Generate(f"t{n}-{j}-b{i}", branches[i], greedy(max_tokens=8)))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert done.wait(TIMEOUT)
    engine.close()

    assert len(received) == num_requests
    for rid, events in received.items():
        kinds = [type(e).__name__ for e in events]
        ends = [e for e in events if isinstance(e, ev.Finished | ev.Failed)]
        assert len(ends) == 1 and ends[0] is events[-1], kinds
        # the request's Stats ride on its Finished, and are never an event of their own
        assert kinds[-1] == "Finished" and events[-1].stats is not None, kinds
        body = kinds[:-1]
        num_progress = body.count("PrefillProgress")
        assert num_progress >= 1 and body[:num_progress] == ["PrefillProgress"] * num_progress
        assert set(body[num_progress:]) <= {"Tokens"}, kinds
        finished = events[-1]
        assert isinstance(finished, ev.Finished)
        assert_same_reply(finished, want[int(rid.rsplit("b", 1)[1])])


def test_failures_are_events_and_the_engine_lives_on(models: dict, tmp_path: Path) -> None:
    with Runner() as runner:
        events = runner.request(ev.Generate("early", (user("hi"),), greedy()))
        assert isinstance(events[0], ev.Failed) and "No model is loaded" in events[0].message
        assert runner.engine.is_alive

        missing = tmp_path / "no-such-model.gguf"
        runner.engine.submit(ev.LoadModel(str(missing)))
        event = runner.next_event()
        assert isinstance(event, ev.Failed) and str(missing) in event.message
        assert runner.engine.is_alive

        broken = tmp_path / "broken.gguf"
        broken.write_bytes(b"GGUF" + b"\x00" * 16)
        runner.engine.submit(ev.LoadModel(str(broken)))
        while isinstance(event := runner.next_event(), ev.ModelLoading):
            pass
        assert isinstance(event, ev.Failed) and str(broken) in event.message
        assert runner.engine.is_alive

        runner.load(models["llama"])
        empties = [
            (),
            (user("   \n"),),
            (ev.Message("system", "Be brief."), user("")),
            (user("Hi"), assistant("Hello."), user(" ")),  # an empty latest message
        ]
        for empty in empties:
            events = runner.request(ev.Generate("empty", empty, greedy()))
            assert isinstance(events[0], ev.Failed) and "empty" in events[0].message
            assert runner.engine.is_alive
        assert_same_reply(
            runner.generate((user(USERS[0]),)),
            fresh_finished(models["llama"], (user(USERS[0]),), greedy()),
        )


def test_a_failed_forward_does_not_wedge_the_engine(models: dict) -> None:
    messages = (user(USERS[0]),)
    with Runner() as runner:
        runner.load(models["llama"])
        session = runner.engine.session
        assert session is not None
        model = session.runner
        real_forward = model.forward
        calls = 0

        def flaky_forward(token_ids: list[int], state: Any, logits: str = "last") -> Any:
            nonlocal calls
            calls += 1
            if calls == 3:  # the second decode step dies half-way, as out of memory would
                state.begin_forward(len(token_ids))
                raise MemoryError
            return real_forward(token_ids, state, logits=logits)

        model.forward = flaky_forward  # type: ignore[method-assign]
        events = runner.request(ev.Generate("oom", messages, greedy()))
        assert isinstance(events[-1], ev.Failed) and "Out of memory" in events[-1].message
        model.forward = real_forward  # type: ignore[method-assign]
        assert_same_reply(
            runner.generate(messages), fresh_finished(models["llama"], messages, greedy())
        )


PLAIN = (str, int, float, bool, type(None))


def _assert_plain(value: Any, where: str) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _assert_plain(getattr(value, f.name), f"{where}.{f.name}")
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            _assert_plain(item, f"{where}[{i}]")
    else:
        assert type(value) in PLAIN, f"{where} is a {type(value).__module__}.{type(value).__name__}"


def test_events_carry_only_plain_python_values(
    models: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    always_draft(monkeypatch)
    seen: list[ev.Event] = []
    with Runner("mlx", cache_dir=tmp_path) as runner:
        runner.on_event = lambda _runner, event: seen.append(event)
        runner.load(models["hybrid"])
        messages: tuple[ev.Message, ...] = (user(USERS[0]),)
        for text in USERS[1:]:
            reply = runner.generate(messages, greedy("lookup", max_tokens=16), "c1")
            messages += (assistant(reply.text), user(text))
        runner.engine.submit(ev.SaveState("c1"))
        assert isinstance(runner.next_event(), ev.StateSaved)
    kinds = {type(e) for e in seen}
    assert {ev.ModelLoading, ev.ModelLoaded, ev.PrefillProgress, ev.Tokens} <= kinds
    assert {ev.Finished, ev.StateSaved} <= kinds and ev.Stats not in kinds
    assert all(e.stats is not None for e in seen if isinstance(e, ev.Finished))
    for i, event in enumerate(seen):
        _assert_plain(event, f"event {i} ({type(event).__name__})")


def test_the_entry_points_let_blas_threads_sleep(tmp_path: Path) -> None:
    """OPENBLAS_THREAD_TIMEOUT is set before NumPy loads OpenBLAS (unless the user set it),
    by configure_process and by `python -m engine`, which calls it first."""
    import os
    import subprocess
    import sys

    direct = (
        "import os, sys\n"
        "from engine.config import EngineConfig, configure_process\n"
        "configure_process(EngineConfig())\n"
        "assert 'numpy' not in sys.modules\n"
        "import numpy\n"
        "print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    )
    missing = str(tmp_path / "none.gguf")
    cli = (  # a missing model: the command fails fast, after the process is configured
        "import os\n"
        "from engine.__main__ import main\n"
        f"assert main(['generate', '--model', {missing!r}, '--prompt', 'hi']) == 1\n"
        "print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    )
    for code in (direct, cli):
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.stdout.strip().splitlines()[-1:] == ["4"], out.stderr
        env["OPENBLAS_THREAD_TIMEOUT"] = "9"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.stdout.strip().splitlines()[-1:] == ["9"], out.stderr
