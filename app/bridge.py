"""The one Qt bridge: engine events (called on the engine thread) become typed signals on
the GUI thread.

The listener only appends to a queue and, when the queue was empty, posts one wake-up;
the GUI thread drains everything queued so far in one go. A fast token stream therefore
costs one queued call per drain, not one per token, and runs of Tokens events reach the
window as one batch.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from PySide6.QtCore import QObject, Qt, Signal

from engine.config import EngineConfig
from engine.events import (
    Failed,
    Finished,
    ModelLoaded,
    ModelLoading,
    PrefillProgress,
    StateSaved,
    Tokens,
)

Listener = Callable[[Any], None]
DRAIN_SLICE_S = 0.010


class EngineLike(Protocol):
    def submit(self, command: Any) -> None: ...
    def close(self) -> None: ...


EngineFactory = Callable[[Listener], EngineLike]


def real_engine(config: EngineConfig) -> EngineFactory:
    """A factory of the real engine, run with `config` (built once, at the entry point):
    the local engine and a remote server behind one router (engine/remote/router.py)."""

    def make_local(listener: Listener) -> EngineLike:
        from engine.engine import Engine

        return Engine(listener, config=config)

    def make(listener: Listener) -> EngineLike:
        from engine.remote.router import EngineRouter

        return EngineRouter(listener, local=make_local)

    return make


class EngineBridge(QObject):
    model_loading = Signal(object)  # ModelLoading
    model_loaded = Signal(object)  # ModelLoaded
    prefill_progress = Signal(object)  # PrefillProgress
    tokens = Signal(object)  # list[Tokens], in arrival order
    finished = Signal(object)  # Finished
    failed = Signal(object)  # Failed
    state_saved = Signal(object)  # StateSaved
    _wake = Signal()

    def __init__(self, engine_factory: EngineFactory, parent=None) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._pending: list[Any] = []
        self._is_closed = False
        self._wake.connect(self._drain, Qt.ConnectionType.QueuedConnection)
        self._engine = engine_factory(self._listen)

    @property
    def engine(self) -> EngineLike:
        return self._engine

    def submit(self, command: Any) -> None:
        if not self._is_closed:
            self._engine.submit(command)

    def close(self) -> None:
        """Stop the engine thread (it saves its state); later events are dropped."""
        if self._is_closed:
            return
        self._engine.close()
        self._is_closed = True

    # -- engine thread ----------------------------------------------------------------

    def _listen(self, event: Any) -> None:
        with self._lock:
            if self._is_closed:
                return
            self._pending.append(event)
            if len(self._pending) > 1:
                return  # a wake-up is already on its way
        with contextlib.suppress(RuntimeError):  # the bridge's C++ side is gone (shutdown)
            self._wake.emit()

    # -- GUI thread -------------------------------------------------------------------

    def _drain(self) -> None:
        """Hand out what has arrived; past DRAIN_SLICE_S of work, yield to the event
        loop and come back for the rest, so a burst of events never stalls the window."""
        deadline = time.perf_counter() + DRAIN_SLICE_S
        with self._lock:
            events, self._pending = self._pending, []
        batch: list[Tokens] = []
        for n, event in enumerate(events):
            if isinstance(event, Tokens):
                batch.append(event)
                continue
            if batch:
                self.tokens.emit(batch)
                batch = []
            self._dispatch(event)
            if time.perf_counter() > deadline and n + 1 < len(events):
                self._requeue(events[n + 1 :])
                return
        if batch:
            self.tokens.emit(batch)

    def _requeue(self, events: list[Any]) -> None:
        with self._lock:
            self._pending[:0] = events
        self._wake.emit()

    def _dispatch(self, event: Any) -> None:
        signal = {
            ModelLoading: self.model_loading,
            ModelLoaded: self.model_loaded,
            PrefillProgress: self.prefill_progress,
            Finished: self.finished,
            Failed: self.failed,
            StateSaved: self.state_saved,
        }.get(type(event))
        if signal is not None:
            signal.emit(event)
