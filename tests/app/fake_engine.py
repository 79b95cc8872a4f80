"""A stand-in for engine.engine.Engine: the same API, scripted replies streamed word by
word from a background thread, with the real engine's event order and Stop semantics
(Finished.text holds only what this request generated, a continuation included)."""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from engine import events as ev

Reply = Callable[[ev.Generate], str]


def echo_reply(command: ev.Generate) -> str:
    if command.settings.continue_last:
        return " and that is the rest."
    last_user = next(m.content for m in reversed(command.messages) if m.role == "user")
    return f"Echo: {last_user}"


def split_tokens(text: str) -> list[str]:
    return re.findall(r"\s*\S+|\s+", text)


class FakeEngine:
    def __init__(self, listener: Callable[[Any], None], reply: Reply = echo_reply) -> None:
        self.listener = listener
        self.reply = reply
        self.commands: list[Any] = []
        self.token_delay = 0.0  # seconds between tokens
        self.pause_after: int | None = None  # tokens, then wait for a Stop or `resume()`
        self.fail_next: tuple[str, str] | None = None  # (message, details)
        self.tokens_override: list[str] | None = None  # stream exactly these pieces
        self._resume = threading.Event()
        self._stopped: set[str] = set()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="fake-engine", daemon=True)
        self._thread.start()

    def submit(self, command: Any) -> None:
        self.commands.append(command)
        if isinstance(command, ev.Stop):
            self._stopped.add(command.request_id)
        self._queue.put(command)

    def close(self) -> None:
        self._queue.put(ev.Close())
        self._resume.set()
        self._thread.join(5)

    def resume(self) -> None:
        self.pause_after = None
        self._resume.set()

    def generates(self) -> list[ev.Generate]:
        return [c for c in self.commands if isinstance(c, ev.Generate)]

    def _run(self) -> None:
        while True:
            command = self._queue.get()
            if isinstance(command, ev.Close):
                return
            if isinstance(command, ev.LoadModel):
                self.listener(ev.ModelLoading(command.path, "reading weights", 0.5))
                self.listener(
                    ev.ModelLoaded(command.path, "Fake-1M", "llama", 1_000_000, "F32", 2048, "cpu")
                )
            elif isinstance(command, ev.Generate):
                self._generate(command)

    def _generate(self, command: ev.Generate) -> None:
        rid = command.request_id
        if self.fail_next is not None:
            message, details = self.fail_next
            self.fail_next = None
            self.listener(ev.Failed(rid, message, details))
            return
        self.listener(ev.PrefillProgress(rid, 0, 120, 40))
        self.listener(ev.PrefillProgress(rid, 120, 120, 40))
        pieces = self.tokens_override or split_tokens(self.reply(command))
        # Built up front, so the stream itself costs the GIL as little as an engine's would.
        events = [ev.Tokens(rid, piece, (i,), (i % 2 == 1,)) for i, piece in enumerate(pieces)]
        out: list[str] = []
        for i, event in enumerate(events):
            while self.pause_after is not None and i >= self.pause_after:
                if rid in self._stopped or self._resume.wait(0.005):
                    break
            if rid in self._stopped:
                break
            self.listener(event)
            out.append(event.text)
            if self.token_delay:
                time.sleep(self.token_delay)
        reason = "stopped" if rid in self._stopped else "eos"
        n = len(out)
        stats = ev.Stats(rid, 160, n, 40, 120, 0.05, 2400.0, 50.0, n, n // 2, 160 + n, 2048)
        self.listener(ev.Finished(rid, reason, "".join(out), tuple(range(n)), stats))
