"""The remote backend beside the local engine on the same model: TTFT of an edit at
depth, of going back to the branch, decode speed, and the cached tokens each reports.

    python -m bench remote [--json] [--runs N] [--url URL] [--backend numpy|mlx]

Without --url it starts llama-cpp-python's OpenAI-compatible server on loopback serving
the default model (the [server] extra; 2 threads, the machine's cores). The conversation
is bench/edit.py's (~2k tokens, 7 turns). Each run, on each side: a warm-up on other text,
the whole conversation (a full prefill: a fresh Engine, and the server's cache holds the
warm-up's text), an edit of the middle user message (the rest of the chat after it is
recomputed), the original branch again, and a 128-token greedy reply for the decode
speed. The local side
is the Engine (prefix reuse, branch cache); the remote side the RemoteEngine over the
server's own prefix cache (llama-cpp-python keeps one sequence and reuses its longest
common prefix). The server's reports say how much it reused where it reports it; this
server reports nothing while streaming, so its log's prefix-match lines are given too,
labelled as such.
"""

from __future__ import annotations

import argparse
import queue
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import common
from bench.edit import NUM_TURNS, WARM_UP, WORDS_PER_MESSAGE, EngineClient, edited
from engine.config import EngineConfig

DECODE_TOKENS = 128
N_CTX = 4096


class RemoteClient:
    """A blocking client over the RemoteEngine's events (one request at a time)."""

    def __init__(self, url: str) -> None:
        from engine import events as ev
        from engine.remote.connection import ConnectRemote, RemoteConnection
        from engine.remote.engine import RemoteEngine

        self.ev = ev
        self.events: queue.Queue[Any] = queue.Queue()
        self.engine = RemoteEngine(self.events.put)
        self.engine.submit(ConnectRemote(RemoteConnection(url, read_timeout_s=600)))
        event = self._next()
        if not isinstance(event, ev.ModelLoaded):
            raise RuntimeError(f"could not connect to {url}: {event.message}")
        self.loaded = event

    def reply(self, messages, max_tokens: int) -> Any:
        from engine.sampling import SamplingSettings

        ev = self.ev
        settings = ev.GenerationSettings(SamplingSettings(temperature=0.0), max_tokens=max_tokens)
        msgs = tuple(ev.Message(role, content) for role, content in messages)
        self.engine.submit(ev.Generate(uuid.uuid4().hex, msgs, settings))
        event = self._next()
        if isinstance(event, ev.Failed):
            raise RuntimeError(event.message)
        return event

    def _next(self) -> Any:
        while True:
            event = self.events.get()
            if not isinstance(event, self.ev.Tokens):
                return event

    def close(self) -> None:
        self.engine.close()


class LoopbackServer:
    """llama_cpp.server on a free loopback port, its log in a temporary file."""

    def __init__(self, model: Path, threads: int) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        self.log = Path(tempfile.mkdtemp(prefix="bench-remote-")) / "server.log"
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
                   "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(N_CTX),
                   "--n_threads", str(threads)]  # fmt: skip
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                urllib.request.urlopen(f"{self.url}/models", timeout=2).close()
                return
            except OSError:
                time.sleep(0.25)
        raise RuntimeError(f"llama_cpp.server did not start: {self.log.read_text()[-2000:]}")

    def last_prefix_hit(self, since: int) -> int | None:
        """The tokens the server's log says its last request reused (None: no line)."""
        hits = re.findall(r"(\d+) prefix-match hit", self.log.read_text(errors="replace")[since:])
        return int(hits[-1]) if hits else None

    def log_size(self) -> int:
        return len(self.log.read_text(errors="replace"))

    def close(self) -> None:
        self.process.kill()
        self.process.wait(10)


def run_side(
    make_client: Callable[[], Any], messages, runs: int, server: LoopbackServer | None
) -> dict[str, Any]:
    """TTFT of the full conversation, the middle edit, the way back; decode tok/s. Each
    run has a fresh client (the local engine's caches start empty), and the warm-up
    leaves the server's cache holding other text."""
    middle = 2 * (NUM_TURNS // 2) + 1  # a user message near the middle
    samples: dict[str, list[float]] = {"full": [], "edit_middle": [], "back": [], "decode": []}
    reused: dict[str, Any] = {}
    for run in range(runs):
        client = make_client()
        client.reply(WARM_UP, 1)
        for name, convo in (("full", messages), ("edit_middle", edited(messages, middle, run)),
                            ("back", messages)):  # fmt: skip
            since = server.log_size() if server else 0
            stats = client.reply(convo, 1).stats
            samples[name].append(stats.ttft_s)
            reused[name] = {
                "reported": stats.reused_tokens
                if "cached_tokens" in stats.server_reported or not stats.server
                else None,
                "prompt_tokens": stats.prompt_tokens or None,
            }
            if server is not None:
                reused[name]["server_log_prefix_hit"] = server.last_prefix_hit(since)
        samples["decode"].append(client.reply(messages, DECODE_TOKENS).stats.decode_tok_s)
        client.close()
    return {
        "ttft_s": {k: common.spread(v) for k, v in samples.items() if k != "decode"},
        "decode_tok_s": common.spread(samples["decode"]),
        "reused_tokens": reused,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{'':8} {'full':>8} {'edit':>8} {'back':>8} {'decode':>10}  reused (full/edit/back)")
    for side in ("local", "remote"):
        r = result[side]
        t = r["ttft_s"]
        reused = "/".join(str(r["reused_tokens"][k].get("reported")) for k in t)
        logged = [r["reused_tokens"][k].get("server_log_prefix_hit") for k in t]
        log = f"  server log: {'/'.join(map(str, logged))}" if side == "remote" else ""
        ttft = " ".join(f"{t[k]['median']:8.3f}" for k in ("full", "edit_middle", "back"))
        print(f"{side:8} {ttft} {r['decode_tok_s']['median']:10.1f}  {reused}{log}")


def main(argv: list[str] | None = None, config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench remote", description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--url", help="a running server instead of llama-cpp-python's")
    parser.add_argument("--backend", choices=("numpy", "mlx"))
    parser.add_argument("--threads", type=int, default=2, help="the started server's threads")
    args = parser.parse_args(argv)
    load = common.warn_if_busy()
    model = common.default_model()
    messages = tuple(common.conversation(NUM_TURNS, WORDS_PER_MESSAGE))
    engine_config = common.engine_config(config, args.backend)
    local_result = run_side(lambda: EngineClient(model, engine_config), messages, args.runs, None)
    server = None if args.url else LoopbackServer(model, args.threads)
    url = args.url or server.url  # type: ignore[union-attr]
    try:
        remote_result = run_side(lambda: RemoteClient(url), messages, args.runs, server)
    finally:
        if server is not None:
            server.close()
    result = {
        "bench": "remote",
        "started": common.now_iso(),
        "machine": common.machine(),
        "load_average_1m": load,
        "versions": common.versions(),
        "model": common.model_info(model),
        "server": args.url or "llama-cpp-python (python -m llama_cpp.server), loopback",
        "runs": args.runs,
        "local": local_result,
        "remote": common.rounded(remote_result),
    }
    return common.report("remote", common.rounded(result), args.json, print_table)
