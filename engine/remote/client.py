"""The `openai` client for one connection, and the messages a person reads when a call
to the server fails.

The client retries nothing (a retry is the person's, from the window) and reads the
OpenAI_* environment variables for nothing: the key and the URL are the connection's,
so a key meant for one server is never sent to another.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from dataclasses import dataclass
from typing import Any

import httpx2
import openai

from engine.remote.connection import RemoteConnection

NO_KEY = "no-key"  # the client insists on a key; servers without auth ignore this one


@dataclass(frozen=True)
class ServedModel:
    id: str
    context_length: int = 0  # 0: the server did not say


def make_client(connection: RemoteConnection) -> openai.OpenAI:
    timeout = httpx2.Timeout(connection.read_timeout_s, connect=connection.connect_timeout_s)
    return openai.OpenAI(
        base_url=connection.api_base,
        api_key=connection.api_key or NO_KEY,
        organization=None,
        project=None,
        timeout=timeout,
        max_retries=0,
        http_client=httpx2.Client(verify=connection.verify_tls, timeout=timeout),
    )


def list_models(client: openai.OpenAI) -> list[ServedModel]:
    """The server's /v1/models, with each model's context length where it tells it
    (vLLM: max_model_len; llama-server: meta.n_ctx_train)."""
    models = []
    for entry in client.models.list():
        extra = entry.model_extra or {}
        meta = extra.get("meta") if isinstance(extra.get("meta"), dict) else {}
        context = extra.get("max_model_len") or (meta or {}).get("n_ctx_train") or 0
        models.append(ServedModel(entry.id, int(context) if isinstance(context, int) else 0))
    return models


def interrupt(stream: Any) -> None:
    """End a streamed answer now, from any thread: shutting the socket down wakes the
    thread blocked reading it and tells the server the client has gone, so it stops
    generating (closing the descriptor alone would do neither while a read waits)."""
    network = stream.response.extensions.get("network_stream")
    sock = network.get_extra_info("socket") if network is not None else None
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):  # already closed
            sock.shutdown(socket.SHUT_RDWR)


def describe_error(exc: BaseException, connection: RemoteConnection) -> str:
    """What went wrong talking to the server, in words a person can act on."""
    where = f"The server at {connection.api_base}"
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        return (
            f"{where} refused the API key ({exc.status_code}). Check the key in the "
            "connection (Model ▸ Connect to server…)."
        )
    if isinstance(exc, openai.NotFoundError):
        return (
            f"{where} answered 404 Not Found: it has no model named {connection.model!r}, "
            f"or the URL is not its OpenAI-compatible base (usually ending in /v1). "
            f"Server said: {_server_message(exc)}"
        )
    if isinstance(exc, openai.APIStatusError):
        return f"{where} refused the request ({exc.status_code}): {_server_message(exc)}"
    if isinstance(exc, openai.APITimeoutError | httpx2.TimeoutException):
        cause = exc if isinstance(exc, httpx2.TimeoutException) else exc.__cause__
        if isinstance(cause, httpx2.ConnectTimeout):
            return (
                f"{where} could not be reached within {connection.connect_timeout_s:g} s "
                "(connect timeout). Is the host right and up?"
            )
        return (
            f"{where} did not answer within {connection.read_timeout_s:g} s (read "
            "timeout). It may be busy or stuck; retry, or raise the read timeout in the "
            "connection."
        )
    cause = exc.__cause__ if isinstance(exc, openai.APIConnectionError) else exc
    if _is_tls_failure(cause):
        return (
            f"{where} did not pass TLS verification: {cause}. Use its http:// URL on a "
            "trusted network, or install its certificate."
        )
    if isinstance(exc, openai.APIConnectionError) or isinstance(cause, httpx2.ConnectError):
        return (
            f"Could not reach the server at {connection.api_base}: {_root(exc)}. Is it "
            "running, and is the URL right?"
        )
    return f"{where} failed: {_root(exc)}"


def _is_tls_failure(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, ssl.SSLError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _root(exc: BaseException) -> str:
    """The innermost cause's text (e.g. '[Errno 111] Connection refused')."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return str(exc) or type(exc).__name__


def _server_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else error
        if message:
            return str(message)
        detail = body.get("detail")
        if detail:
            return str(detail)
    return exc.message
