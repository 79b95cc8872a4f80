"""Helpers for the engine's end-to-end tests (test_engine*.py, test_session.py): a `Runner`
that drives one Engine from the test thread, the tiny models' prompts rendered without the
engine (`prompt_ids`), and what a fresh engine replies to a branch (`fresh_finished`).
"""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pytest

from engine import events as ev
from engine.config import EngineConfig
from engine.draft_costs import MAX_DRAFT, AcceptanceModel, CostModel
from engine.engine import Engine
from engine.sampling import SamplingSettings
from tests.conftest import TinyModels
from tests.hybrid_models import make_hybrid_dir
from tests.tiny_tokenizer import CHAT_TEMPLATE, build_hf_tokenizer

TIMEOUT = 60.0  # seconds to wait for one event before calling the engine hung
GREEDY = SamplingSettings(temperature=0.0)
USERS = ("Hello there, who are you?", "Tell me about the sea and the sky.", "Why is it blue?")


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

    def __init__(
        self, backend: str = "numpy", cache_dir: Path | None = None, **config: Any
    ) -> None:
        """`config`: more EngineConfig fields (a snapshot policy, a memory budget)."""
        self.events: queue.Queue[ev.Event] = queue.Queue()
        self.on_event: Callable[[Runner, ev.Event], None] | None = None  # on the engine thread
        self.engine = Engine(
            self._listen, config=EngineConfig(backend=backend, **config), cache_dir=cache_dir
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
    """Verifying any number of rows costs one step and drafting a token nothing, so every
    request drafts the longest proposal it can (measured costs would make the choice
    depend on the machine's load, and a draft model's size prior on the tiny models')."""
    monkeypatch.setattr(CostModel, "cost", lambda self, rows: 1.0)
    monkeypatch.setattr(CostModel, "table", lambda self: [1.0] * (MAX_DRAFT + 2))
    monkeypatch.setattr(AcceptanceModel, "draft_seconds", lambda self, costs: 0.0)
