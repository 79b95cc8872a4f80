"""The engine: ONE worker thread that owns every MLX array, fed by a command queue.

Commands (engine/events.py) go in through `submit` from any thread; events come out
through the listener, called on the worker thread. Nothing raises across threads:
every error becomes a `Failed` event with a message a person can act on. `Stop` is
seen within one decode step or one prefill chunk, because the worker polls a flag the
submitting thread sets directly (the queue is busy with the running request).
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from engine import events as ev
from engine.config import EngineConfig
from engine.errors import EngineError, ModelLoadError
from engine.loader import LoadedModel, load_model
from engine.model_probe import probe_model
from engine.session import Session

log = logging.getLogger(__name__)

Listener = Callable[[ev.Event], None]
# After a reply, the state is saved to the prompt cache once no command has come for this
# long: off the reply's path (a 2k-token state of the default model is ~92 MB, 0.25-0.6 s
# to write on the 2-core machine), yet on disk before a crash a few seconds later.
AUTOSAVE_IDLE_S = 2.0


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
        self._config = config or EngineConfig()  # SetMemoryBudget replaces its budget
        if cache_dir:  # one place says it: the loader keeps its weight digests there too
            self._config = replace(self._config, prompt_cache_dir=str(cache_dir))
        folder = self._config.prompt_cache_dir
        self._cache_dir = Path(folder) if folder else None
        self._commands: queue.Queue[ev.Command] = queue.Queue()
        self._stop_lock = threading.Lock()
        self._stopped: set[str] = set()
        self._closing = threading.Event()  # set by close(): stop what runs, skip what waits
        self._is_unsaved = False  # a reply changed the state since the prompt cache saw it
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
            try:
                command = self._commands.get(timeout=AUTOSAVE_IDLE_S if self._is_unsaved else None)
            except queue.Empty:  # idle since the last reply
                self._is_unsaved = False
                self._save_quietly()
                continue
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
                        "Out of memory. Try a smaller model or lower the memory budget "
                        "in Settings.",
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
        elif isinstance(command, ev.SetMemoryBudget):
            self._config = replace(self._config, memory_budget_bytes=command.max_bytes)
            if self.session is not None:
                self.session.set_memory_budget(command.max_bytes)
        elif isinstance(command, ev.Stop):
            with self._stop_lock:  # a stop for a request that already ended
                self._stopped.discard(command.request_id)

    def _load(self, command: ev.LoadModel) -> None:
        """One rule (the module docstring of engine/model_probe.py says why): look at the
        new file cheaply, release the model held, load the new one. A failed load says
        which model answers afterwards: the old one when the look refused the file, none
        when the full load failed; a bad draft model leaves the main model without one."""
        active = self.session.loaded if self.session is not None else None
        try:
            probe_model(command.path)
        except ModelLoadError as exc:
            still = f"{active.name} is still loaded." if active else "No model is loaded."
            self._load_failed(command.path, f"{exc}. {still}", active)
            return
        released = f" ({active.name} was released to make room)" if active else ""
        self._release()
        del active  # nothing may keep the old model alive while the new one loads

        def progress(stage: str, fraction: float) -> None:
            self._emit(ev.ModelLoading(command.path, stage, fraction))

        try:
            loaded = load_model(command.path, self._config, progress)
            draft, draft_error = self._load_draft(command.draft_model_path, loaded)
            session = Session(loaded, draft, self._cache_dir, self._config)
            self._emit(ev.ModelLoading(command.path, "measuring speed", 0.95))
            session.calibrate()
        except Exception as exc:
            if not isinstance(exc, EngineError | MemoryError):
                log.exception("loading %s failed", command.path)
            problem = "out of memory" if isinstance(exc, MemoryError) else str(exc)
            self._load_failed(
                command.path,
                f"{problem}. No model is loaded now{released}; pick one from the Model menu.",
                None,
                traceback.format_exc(),
            )
            return
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
                draft_error=draft_error,
                has_chat_template=loaded.tokenizer.chat_template is not None,
            )
        )
        if draft_error:  # shown like every failure; the main model answers meanwhile
            self._load_failed(command.draft_model_path or "", draft_error, loaded)
        if session.block_problem and self._config.block_drafter not in (None, "off"):
            self._load_failed(self._config.block_drafter, session.block_problem, loaded)

    def _load_draft(self, path: str | None, loaded: LoadedModel) -> tuple[LoadedModel | None, str]:
        """The draft model at `path` for `loaded`, or None and why it could not be."""
        if not path:
            return None, ""
        try:
            probe_model(path)
            draft = load_model(path, self._config)
        except (EngineError, MemoryError) as exc:
            problem = "out of memory" if isinstance(exc, MemoryError) else str(exc)
            return None, _draft_error(problem, loaded)
        if draft.config.vocab_size != loaded.config.vocab_size:
            problem = (
                f"{path}: {draft.name} has a different vocabulary "
                f"({draft.config.vocab_size} vs {loaded.config.vocab_size} tokens)"
            )
            return None, _draft_error(problem, loaded)
        return draft, ""

    def _release(self) -> None:
        """Let go of the model held (its prompt cache saved first), so that loading the
        next one never holds both."""
        self._save_quietly()
        self.session = None
        gc.collect()  # a model's arrays sit in reference cycles (model <-> runner)
        import mlx.core as mx

        mx.clear_cache()  # MLX keeps freed buffers for reuse; give them back

    def _load_failed(
        self, path: str, message: str, active: LoadedModel | None, details: str = ""
    ) -> None:
        self._emit(
            ev.Failed(
                "",
                message,
                details,
                load_path=path,
                active_model=str(active.path) if active is not None else "",
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
            self._is_unsaved = self._cache_dir is not None
            with self._stop_lock:
                self._stopped.discard(rid)

    def _save_quietly(self) -> None:
        if self.session is None:
            return
        try:
            self.session.save()
        except Exception:
            log.exception("could not save the prompt cache")


def _request_id(command: ev.Command) -> str:
    return getattr(command, "request_id", "")


def _draft_error(problem: str, loaded: LoadedModel) -> str:
    return (
        f"The draft model could not be loaded: {problem}. {loaded.name} is loaded without "
        "it; speculative decoding uses prompt lookup instead."
    )
