"""The remote engine: one worker thread driving an OpenAI-compatible server, with the
local Engine's contract (engine/engine.py): commands in through `submit`, events out
through the listener on the worker thread, every error a `Failed` with a message a
person can act on, nothing raised across threads.

`Stop` ends the stream at once from the submitting thread (`client.interrupt` shuts its
socket down), so the worker's blocked read returns and the server sees the client go.
A server that goes away mid-reply ends the request with `Failed`; the window keeps what
streamed as a stopped reply (as after a local stop), and the next request reconnects.
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from engine import events as ev
from engine.remote.connection import REMOTE_FAMILY, ConnectRemote, RemoteConnection
from engine.remote.request import chat_request, refusal

log = logging.getLogger(__name__)

Listener = Callable[[ev.Event], None]
NOT_CONNECTED = "No server is connected: choose one with Model ▸ Connect to server… first."


class RemoteEngine:
    def __init__(self, listener: Listener, *, stop_sequences: tuple[str, ...] = ()) -> None:
        """`stop_sequences`: sent with every request (the CLI's --stop)."""
        self._listener = listener
        self._stop_sequences = stop_sequences
        self._commands: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self._stopped: set[str] = set()
        self._streaming: tuple[str, Any] | None = None  # (request id, its open stream)
        self._closing = threading.Event()
        self.connection: RemoteConnection | None = None  # touched only on the worker
        self._client: Any = None
        self._context_length = 0
        self._thread = threading.Thread(target=self._run, name="remote-engine", daemon=True)
        self._thread.start()

    # -- any thread -------------------------------------------------------------------

    def submit(self, command: Any) -> None:
        if isinstance(command, ev.Stop):
            with self._lock:
                self._stopped.add(command.request_id)
                streaming = self._streaming
            if streaming is not None and streaming[0] == command.request_id:
                self._interrupt(streaming[1])
        self._commands.put(command)

    def close(self, timeout: float = 10.0) -> None:
        """End the running request, skip what waits, and end the worker thread."""
        if self._thread.is_alive():
            self._closing.set()
            with self._lock:
                streaming = self._streaming
            if streaming is not None:
                self._interrupt(streaming[1])
            self._commands.put(ev.Close())
            self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # -- the worker thread ------------------------------------------------------------

    def _emit(self, event: ev.Event) -> None:
        try:
            self._listener(event)
        except Exception:  # a listener bug must not kill the engine
            log.exception("remote engine listener raised")

    def _run(self) -> None:
        while True:
            command = self._commands.get()
            if isinstance(command, ev.Close):
                self._drop_client()
                return
            if self._closing.is_set() and isinstance(command, ev.Generate | ConnectRemote):
                continue
            try:
                if isinstance(command, ConnectRemote):
                    self._connect(command.connection)
                elif isinstance(command, ev.Generate):
                    self._generate(command)
                elif isinstance(command, ev.Stop):
                    with self._lock:  # a stop for a request that already ended
                        self._stopped.discard(command.request_id)
            except Exception as exc:  # a bug here must still reach the window
                log.exception("remote command failed")
                request_id = command.request_id if isinstance(command, ev.Generate) else ""
                self._emit(ev.Failed(request_id, f"Internal error: {exc}", traceback.format_exc()))

    def _connect(self, connection: RemoteConnection) -> None:
        """List the server's models; the connection's model must be one of them (a
        server serving one model may answer any name, so the check is the client's)."""
        from engine.remote.client import describe_error, list_models, make_client

        self._drop_client()
        client = make_client(connection)
        try:
            models = list_models(client)
        except Exception as exc:
            client.close()
            self._emit(
                ev.Failed("", describe_error(exc, connection), repr(exc), connection.api_base)
            )
            return
        ids = [m.id for m in models]
        chosen = next((m for m in models if m.id == connection.model), None)
        if chosen is None and not connection.model and models:
            chosen = models[0]
        if chosen is None:
            client.close()
            served = ", ".join(ids) if ids else "no models at all"
            self._emit(
                ev.Failed(
                    "",
                    f"The server at {connection.api_base} has no model named "
                    f"{connection.model!r}. It serves: {served}.",
                    load_path=connection.api_base,
                )
            )
            return
        self._client, self._context_length = client, chosen.context_length
        self.connection = replace(connection, model=chosen.id)
        self._emit(
            ev.ModelLoaded(
                path=connection.api_base,
                name=chosen.id.rsplit("/", 1)[-1],
                family=REMOTE_FAMILY,
                num_parameters=0,
                quantization="",
                context_length=chosen.context_length,
                backend=f"server {connection.label}",
            )
        )

    def _generate(self, command: ev.Generate) -> None:
        from engine.remote.client import describe_error
        from engine.remote.reply import RemoteReply

        request_id = command.request_id
        connection = self.connection
        if connection is None or self._client is None:
            self._emit(ev.Failed(request_id, NOT_CONNECTED))
            return
        why = refusal(command.settings)
        if why is not None:
            self._emit(ev.Failed(request_id, why))
            return
        body, extra = chat_request(
            connection.model, command.messages, command.settings, stop=self._stop_sequences
        )
        reply = RemoteReply(request_id, self._emit)
        stream = None
        try:
            if self._is_stopped(request_id):
                raise _Stopped
            stream = self._client.chat.completions.create(**body, extra_body=extra)
            with self._lock:
                self._streaming = (request_id, stream)
                stopped_meanwhile = request_id in self._stopped
            if stopped_meanwhile:
                self._interrupt(stream)
            for chunk in stream:
                if self._is_stopped(request_id):
                    break
                reply.add(chunk)
        except _Stopped:
            pass
        except Exception as exc:
            if not self._is_stopped(request_id):
                self._fail_mid_reply(request_id, reply, describe_error(exc, connection), exc)
                self._end(request_id, stream)
                return
        self._end(request_id, stream)
        reply.finish()
        stopped = self._is_stopped(request_id, discard=True)
        stats = reply.stats(server=connection.label, context_length=self._context_length)
        reason = reply.reason(stopped=stopped)
        self._emit(ev.Finished(request_id, reason, reply.answer, (), stats, reply.thinking))

    def _fail_mid_reply(
        self, request_id: str, reply: Any, message: str, exc: BaseException
    ) -> None:
        self._is_stopped(request_id, discard=True)
        if reply.has_text:
            reply.finish()
            message = (
                f"The server went away mid-reply. {message} The part that arrived is "
                "kept as a stopped reply; regenerate it once the server is back."
            )
        self._emit(ev.Failed(request_id, message, repr(exc)))

    def _end(self, request_id: str, stream: Any) -> None:
        with self._lock:
            if self._streaming is not None and self._streaming[0] == request_id:
                self._streaming = None
        if stream is not None:
            try:
                stream.close()
            except Exception:  # the connection is already gone
                log.debug("closing a remote stream failed", exc_info=True)

    def _is_stopped(self, request_id: str, *, discard: bool = False) -> bool:
        with self._lock:
            stopped = request_id in self._stopped or self._closing.is_set()
            if discard:
                self._stopped.discard(request_id)
        return stopped

    def _interrupt(self, stream: Any) -> None:
        from engine.remote.client import interrupt

        interrupt(stream)

    def _drop_client(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client, self.connection = None, None


class _Stopped(Exception):
    """A stop came before the request was sent."""
