"""Blocking helpers over an engine's event stream, for the terminal commands: the local
Engine (engine/cli.py) and a RemoteEngine (engine/remote/cli.py) emit the same events."""

from __future__ import annotations

import queue
import sys
from collections.abc import Callable
from typing import Any, Protocol

from engine import events as ev


class EngineLike(Protocol):
    def submit(self, command: Any) -> None: ...
    def close(self) -> None: ...


class EventClient:
    """Commands in through `engine.submit`; events read back from `events`.

    make_engine builds the engine around the listener it must emit to."""

    def __init__(self, make_engine: Callable[[Callable[[ev.Event], None]], EngineLike]) -> None:
        self.events: queue.Queue[ev.Event] = queue.Queue()
        self.engine = make_engine(self.events.put)

    def wait_loaded(self, command: object) -> ev.ModelLoaded | None:
        """Submit a load or connect command; the ModelLoaded, or None after printing why."""
        self.engine.submit(command)
        while True:
            event = self.events.get()
            if isinstance(event, ev.ModelLoaded):
                return event
            if isinstance(event, ev.Failed):
                print(f"error: {event.message}", file=sys.stderr)
                return None

    def stream(self, cmd: ev.Generate, echo: bool) -> ev.Finished | ev.Failed:
        """Run one request, echoing its text; Ctrl-C stops it (the partial reply ends it)."""
        self.engine.submit(cmd)
        while True:
            try:
                event = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            except KeyboardInterrupt:
                self.engine.submit(ev.Stop(cmd.request_id))
                continue
            if isinstance(event, ev.Tokens) and echo:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, ev.Finished | ev.Failed):
                return event
