"""`python -m engine generate|chat --remote URL`: the terminal commands against a server.

The same loops as the local engine's (engine/cli.py's `_generate` and `_chat`) drive a
RemoteEngine, so `generate --json` prints the same object, its stats saying which
figures the server reported. The API key comes from an environment variable named on
the command line (--api-key-env), never from the command line itself, where `ps` and
the shell's history would show it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from engine import events as ev
from engine.cli_client import EventClient
from engine.remote.connection import ConnectRemote, RemoteConnection


def connection_from(args: argparse.Namespace) -> RemoteConnection:
    key = ""
    if args.api_key_env:
        key = os.environ.get(args.api_key_env, "")
        if not key:
            raise ValueError(f"--api-key-env {args.api_key_env}: that variable is empty or unset")
    return RemoteConnection(
        base_url=args.remote,
        model=args.remote_model or "",
        api_key=key,
        connect_timeout_s=args.connect_timeout,
        read_timeout_s=args.read_timeout,
        verify_tls=not args.no_verify_tls,
    )


class RemoteClient(EventClient):
    """The terminal's client over a RemoteEngine: connect, then stream as the local one."""

    def __init__(self, stop_sequences: tuple[str, ...]) -> None:
        from engine.remote.engine import RemoteEngine

        super().__init__(lambda listener: RemoteEngine(listener, stop_sequences=stop_sequences))

    def connect(self, connection: RemoteConnection) -> ev.ModelLoaded | None:
        return self.wait_loaded(ConnectRemote(connection))


def run(args: argparse.Namespace) -> int:
    from engine import cli

    try:
        connection = connection_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    client: Any = RemoteClient(tuple(args.stop))
    try:
        loaded = client.connect(connection)
        if loaded is None:
            return 1
        if args.command == "generate":
            return int(cli._generate(client, args))
        if args.resume:
            print("error: --resume keeps local chats only; a server keeps none", file=sys.stderr)
            return 2
        return int(cli._chat(client, args, loaded, None))
    finally:
        client.engine.close()
