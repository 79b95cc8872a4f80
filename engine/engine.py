"""The engine: ONE worker thread that owns every MLX array, fed by a command queue.

Commands (engine/events.py) go in through `submit` from any thread; events come out
through the listener, called on the worker thread. Nothing raises across threads:
every error becomes a `Failed` event with a message a person can act on. `Stop` is
seen within one decode step or one prefill chunk, because the worker polls a flag the
submitting thread sets directly (the queue is busy with the running request).
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from engine import events as ev
from engine.config import EngineConfig
from engine.errors import EngineError
from engine.loader import LoadedModel, load_model
from engine.session import Session

log = logging.getLogger(__name__)

Listener = Callable[[ev.Event], None]


class Engine:
    def __init__(
        self,
        listener: Listener,
        *,
        config: EngineConfig | None = None,
        cache_dir: str | Path | None = None,
    ) -> None:
        """`config`: built at the edge (None: EngineConfig()); `cache_dir`: where prompt
        caches persist (None: `config.prompt_cache_dir`, nowhere when that is None too)."""
        self._listener = listener
        self._config = config or EngineConfig()  # SetCacheBudget replaces its budget
        if cache_dir:  # one place says it: the loader keeps its weight digests there too
            self._config = replace(self._config, prompt_cache_dir=str(cache_dir))
        folder = self._config.prompt_cache_dir
        self._cache_dir = Path(folder) if folder else None
        self._commands: queue.Queue[ev.Command] = queue.Queue()
        self._stop_lock = threading.Lock()
        self._stopped: set[str] = set()
        self._closing = threading.Event()  # set by close(): stop what runs, skip what waits
        self.session: Session | None = None  # touched only on the worker thread
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    # -- any thread -------------------------------------------------------------------
    def submit(self, command: ev.Command) -> None:
        if isinstance(command, ev.Stop):
            with self._stop_lock:
                self._stopped.add(command.request_id)
        self._commands.put(command)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the running request (within a decode step or prefill chunk), skip queued
        generations and loads, save the prompt cache, and end the worker thread."""
        if self._thread.is_alive():
            self._closing.set()
            self._commands.put(ev.Close())
            self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # -- the worker thread ----------------------------------------------------------------
    def _emit(self, event: ev.Event) -> None:
        try:
            self._listener(event)
        except Exception:  # a listener bug must not kill the engine
            log.exception("engine listener raised")

    def _run(self) -> None:
        import mlx.core as mx

        # MLX streams are per thread (>= 0.31.2): make this thread's own.
        mx.set_default_stream(mx.new_stream(mx.default_device()))
        while True:
            command = self._commands.get()
            if isinstance(command, ev.Close):
                self._save_quietly()
                return
            if self._closing.is_set() and isinstance(command, ev.Generate | ev.LoadModel):
                continue  # the window is closing: nobody waits for these any more
            try:
                self._handle(command)
            except EngineError as exc:
                self._emit(ev.Failed(_request_id(command), str(exc)))
            except MemoryError:
                self._emit(
                    ev.Failed(
                        _request_id(command),
                        "Out of memory. Try a smaller model or lower the cache budget.",
                        traceback.format_exc(),
                    )
                )
            except Exception as exc:
                log.exception("engine command failed")
                self._emit(
                    ev.Failed(
                        _request_id(command), f"Internal error: {exc}", traceback.format_exc()
                    )
                )

    def _handle(self, command: ev.Command) -> None:
        if isinstance(command, ev.LoadModel):
            self._load(command)
        elif isinstance(command, ev.Generate):
            self._generate(command)
        elif isinstance(command, ev.SaveState):
            if self.session is not None and self.session.conversation_id == command.conversation_id:
                saved = self.session.save()
                if saved is not None:
                    self._emit(ev.StateSaved(command.conversation_id, *saved))
        elif isinstance(command, ev.SetCacheBudget):
            if self.session is not None:
                self.session.branches.budget_bytes = command.max_bytes
                self.session.branches._evict()
            self._config = replace(self._config, cache_budget_bytes=command.max_bytes)
        elif isinstance(command, ev.Stop):
            with self._stop_lock:  # a stop for a request that already ended
                self._stopped.discard(command.request_id)

    def _load(self, command: ev.LoadModel) -> None:
        self._save_quietly()

        def progress(stage: str, fraction: float) -> None:
            self._emit(ev.ModelLoading(command.path, stage, fraction))

        loaded = load_model(command.path, self._config, progress)
        draft: LoadedModel | None = None
        if command.draft_model_path:
            draft = load_model(command.draft_model_path, self._config)
            if draft.config.vocab_size != loaded.config.vocab_size:
                raise EngineError(
                    f"The draft model {draft.name} has a different vocabulary "
                    f"({draft.config.vocab_size} vs {loaded.config.vocab_size} tokens)."
                )
        self.session = None
        session = Session(loaded, draft, self._cache_dir, self._config)
        self._emit(ev.ModelLoading(command.path, "measuring speed", 0.95))
        session.calibrate()
        self.session = session
        cfg = loaded.config
        self._emit(
            ev.ModelLoaded(
                path=str(loaded.path),
                name=loaded.name,
                family=cfg.family,
                num_parameters=int(cfg.extra.get("num_parameters", 0)),
                quantization=cfg.quantization,
                context_length=cfg.context_length,
                backend=loaded.ops.name,
                draft_model=draft.name if draft else None,
            )
        )

    def _generate(self, command: ev.Generate) -> None:
        if self.session is None:
            raise EngineError("No model is loaded yet. Pick a model first.")
        rid = command.request_id

        def should_stop() -> bool:
            return rid in self._stopped or self._closing.is_set()

        try:
            users = [m for m in command.messages if m.role == "user"]
            if not users or not users[-1].content.strip():  # the message being answered
                raise EngineError("The message is empty. Type something to send.")
            self.session.generate(command, self._emit, should_stop)
        finally:
            with self._stop_lock:
                self._stopped.discard(rid)

    def _save_quietly(self) -> None:
        if self.session is None:
            return
        try:
            self.session.save()
        except Exception:
            log.exception("could not save the prompt cache on close")


def _request_id(command: ev.Command) -> str:
    return getattr(command, "request_id", "")
