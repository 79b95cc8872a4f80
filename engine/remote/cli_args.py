"""The --remote flags of `python -m engine generate|chat`, apart from engine/remote/cli.py
so the parser imports no NumPy (engine/__main__.py configures the process first)."""

from __future__ import annotations

import argparse

from engine.remote.connection import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_READ_TIMEOUT_S


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("a remote server (an OpenAI-compatible API)")
    group.add_argument("--remote", metavar="URL", help="e.g. http://127.0.0.1:8080/v1")
    group.add_argument("--remote-model", metavar="NAME", help="default: the first it lists")
    group.add_argument("--api-key-env", metavar="VAR", help="the environment variable with the key")
    group.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT_S)
    group.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT_S)
    group.add_argument("--no-verify-tls", action="store_true", help="accept any certificate")
    group.add_argument("--stop", action="append", default=[], help="a stop sequence (repeatable)")
