"""Blocking helpers over a RemoteEngine's events, for the tests."""

from __future__ import annotations

import queue
import time
import uuid

from engine import events as ev
from engine.remote.connection import ConnectRemote, RemoteConnection
from engine.remote.engine import RemoteEngine


class RemoteRunner:
    def __init__(self) -> None:
        self.events: queue.Queue = queue.Queue()
        self.engine = RemoteEngine(self.events.put)

    def connect(self, connection: RemoteConnection, timeout: float = 30.0):
        self.engine.submit(ConnectRemote(connection))
        return self.next_of(ev.ModelLoaded, ev.Failed, timeout=timeout)

    def next_of(self, *kinds, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            if isinstance(event, kinds):
                return event

    def generate(self, messages, settings=None, *, on_tokens=None, timeout: float = 120.0):
        """(the Finished or Failed event, the Tokens seen)."""
        request_id = uuid.uuid4().hex
        history = tuple(ev.Message(role, text) for role, text in messages)
        settings = settings or ev.GenerationSettings(max_tokens=24)
        self.engine.submit(ev.Generate(request_id, history, settings))
        tokens = []
        deadline = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            if isinstance(event, ev.Tokens) and event.request_id == request_id:
                tokens.append(event)
                if on_tokens is not None:
                    on_tokens(request_id, tokens)
            elif isinstance(event, ev.Finished | ev.Failed) and event.request_id == request_id:
                return event, tokens

    def close(self) -> None:
        self.engine.close()
