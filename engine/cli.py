"""The terminal commands, driving the same Engine (thread, commands, events) as the app."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import uuid
from pathlib import Path

from engine import events as ev
from engine.cli_client import EventClient
from engine.config import EngineConfig
from engine.errors import EngineError
from engine.model_catalog import (
    CATALOG,
    DEFAULT,
    CatalogModel,
    StagePrinter,
    catalog_entry,
    ensure_model,
    resolve_model,
)
from engine.sampling import SamplingSettings
from engine.stats_format import json_figures, terminal_line


def run(args: argparse.Namespace, config: EngineConfig) -> int:
    """One command of `python -m engine`; `config` is built by engine/__main__.py."""
    if args.command == "fetch":
        return _fetch(args)
    if args.command in ("score", "perplexity"):
        from engine.cli_score import run_perplexity, run_score

        return run_score(args, config) if args.command == "score" else run_perplexity(args, config)
    if args.command == "convert":
        from engine.convert import convert_gguf

        try:
            out = convert_gguf(args.gguf, args.out_dir)
        except EngineError as exc:  # a refused file or architecture: its reason, no traceback
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {out}")
        return 0
    model = str(_model_path(args.model))
    client = _Client(config)
    try:
        loaded = client.load(model, args.draft_model)
        if loaded is None:
            return 1
        if args.command == "generate":
            return _generate(client, args)
        return _chat(client, args, loaded, _history_file(config))
    finally:
        client.engine.close()


def _fetch(args: argparse.Namespace) -> int:
    if args.list:
        for shipped in CATALOG:
            where = str(shipped.path()) if shipped.is_present() else "not fetched"
            template = "chat" if shipped.has_chat_template else "no chat template: --raw"
            print(
                f"{shipped.name:14} {shipped.title} ({shipped.family}, {shipped.quantization}, "
                f"{shipped.file_size / 1e6:.0f} MB, {template}) {shipped.source}; {where}"
            )
        return 0
    entry: CatalogModel | None = catalog_entry(args.name) if args.name else DEFAULT
    if entry is None:
        names = ", ".join(m.name for m in CATALOG)
        print(
            f"error: no shipped model is called {args.name!r} (there are: {names})", file=sys.stderr
        )
        return 2
    find_links = Path(args.find_links) if args.find_links else None
    try:
        ensure_model(entry, StagePrinter(), find_links)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if entry.license_notice:
        print(entry.license_notice, file=sys.stderr)
    return 0


def _model_path(name_or_path: str | None) -> Path:
    """--model's file: a path, a catalog name (fetched when missing), or the default."""
    try:
        return resolve_model(name_or_path or DEFAULT.name, StagePrinter())
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


class _Client(EventClient):
    """The terminal's client over a local Engine."""

    def __init__(self, config: EngineConfig) -> None:
        from engine.engine import Engine

        super().__init__(lambda listener: Engine(listener, config=config))

    def load(self, path: str, draft: str | None) -> ev.ModelLoaded | None:
        return self.wait_loaded(ev.LoadModel(path, draft))


def _settings(args: argparse.Namespace, raw: bool = False) -> ev.GenerationSettings:
    sampling = SamplingSettings(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
    )
    return ev.GenerationSettings(
        sampling, max_tokens=args.max_tokens, drafter=args.drafter, raw=raw
    )


def refused_arguments(args: argparse.Namespace) -> str | None:
    """Why a command's arguments cannot be served, checked before a model is loaded or a
    server asked (engine/__main__.py); None when they can."""
    if getattr(args, "command", None) == "generate" and args.raw and args.system:
        return "--raw continues the prompt as it is; it takes no --system"
    return None


def _generate(client: _Client, args: argparse.Namespace) -> int:
    messages = [ev.Message("system", args.system)] if args.system else []
    messages.append(ev.Message("user", args.prompt))
    # One saved state per system prompt: the next run with it (any question) resumes from
    # the longest prefix it shares with this one instead of prefilling it again.
    key = "generate:" + hashlib.sha256((args.system or "").encode()).hexdigest()[:16]
    if args.raw:
        key = "generate:raw"
    cmd = ev.Generate(uuid.uuid4().hex, tuple(messages), _settings(args, args.raw), key)
    result = client.stream(cmd, echo=not args.json)
    if isinstance(result, ev.Failed):
        print(f"error: {result.message}", file=sys.stderr)
        return 1
    s = result.stats
    assert s is not None
    if args.json:
        print(
            json.dumps(
                {
                    "text": result.text,
                    "token_ids": list(result.token_ids),
                    "finish_reason": result.reason,
                    "stats": json_figures(s),
                }
            )
        )
    else:
        print()
        print(terminal_line(s), file=sys.stderr)
    return 0


def _history_file(config: EngineConfig) -> Path | None:
    """The terminal chat's messages, beside the state the prompt cache keeps for them."""
    folder = config.prompt_cache_dir
    return Path(folder) / "terminal-chat.json" if folder else None


def _read_history(path: Path | None) -> list[ev.Message] | None:
    if path is None or not path.is_file():
        return None
    try:
        entries = json.loads(path.read_text())["messages"]
        return [ev.Message(str(e["role"]), str(e["content"])) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"warning: could not read the last chat from {path} ({exc})", file=sys.stderr)
        return None


def _write_history(path: Path | None, history: list[ev.Message]) -> None:
    if path is None:
        return
    entries = [{"role": m.role, "content": m.content} for m in history]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"messages": entries}))
        os.replace(tmp, path)  # a crash leaves the previous chat, never half of one
    except OSError as exc:
        print(f"warning: could not keep the chat in {path} ({exc})", file=sys.stderr)


def _chat(
    client: _Client, args: argparse.Namespace, loaded: ev.ModelLoaded, history_file: Path | None
) -> int:
    print(
        f"{loaded.name} ({loaded.family}, {loaded.quantization}, {loaded.context_length} ctx, "
        f"{loaded.backend}). /reset starts over, /quit or Ctrl+D leaves, Ctrl+C stops a reply.",
        file=sys.stderr,
    )
    history: list[ev.Message] = [ev.Message("system", args.system)] if args.system else []
    if args.resume:
        if history_file is None:
            print("error: --resume needs the prompt cache, which keeps the chat", file=sys.stderr)
            return 2
        resumed = _read_history(history_file)
        if resumed:
            history = resumed
            print(f"resumed the last chat: {len(history)} messages", file=sys.stderr)
    # one conversation for the terminal: its saved state is the last chat's, so --resume
    # (or a new chat with the same system message) prefills only what is new
    conversation = "terminal-chat"
    while True:
        try:
            line = input("\n> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/quit", "/exit"):
            return 0
        if line.strip() == "/reset":
            history = history[:1] if history and history[0].role == "system" else []
            _write_history(history_file, history)
            continue
        if not line.strip():
            continue
        history.append(ev.Message("user", line))
        cmd = ev.Generate(uuid.uuid4().hex, tuple(history), _settings(args), conversation)
        result = client.stream(cmd, echo=True)
        print()
        if isinstance(result, ev.Failed):
            print(f"error: {result.message}", file=sys.stderr)
            history.pop()
            continue
        history.append(ev.Message("assistant", result.text))
        _write_history(history_file, history)
        if result.stats is not None:
            print(terminal_line(result.stats), file=sys.stderr)
