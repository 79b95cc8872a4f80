"""The engine thread end to end: commands in, events out, on tiny llama and hybrid models.

Every request's tokens are compared with a FRESH engine given the same branch (greedy,
float32), so reuse, rollback and caching can only ever change speed, never text. The
helpers (`Runner`, `prompt_ids`, `fresh_finished`) are in engine_runner.py, shared with
test_engine_prompt_cache.py and test_session.py.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine import events as ev
from engine.branch_cache import common_prefix
from engine.config import EngineConfig
from engine.engine import Engine
from tests.engine.engine_runner import (
    TIMEOUT,
    USERS,
    Runner,
    always_draft,
    assert_same_reply,
    assistant,
    fresh_finished,
    greedy,
    prompt_ids,
    user,
)

KINDS = ["llama", "hybrid"]

# -- stop ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_stop_during_prefill_keeps_exactly_the_chunks_done(kind: str, models: dict) -> None:
    messages = (user(" ".join(USERS * 4)),)
    ids = prompt_ids(messages)
    progress: list[ev.PrefillProgress] = []

    def stop_on_first_chunk(runner: Runner, event: ev.Event) -> None:
        if isinstance(event, ev.PrefillProgress):
            progress.append(event)
            if event.done > 0 and len(progress) == 2:
                runner.engine.submit(ev.Stop(event.request_id))

    with Runner(prefill_chunk=16) as runner:
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
        assert finished.reason == "context_full" and len(finished.token_ids) == 512 - num_near
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
