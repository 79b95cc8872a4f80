"""Time to first token after an edit: ours (the Engine, reusing the cached prefix) against a
full prefill, and llama.cpp / mlx-lm with their own prompt caches.

    python -m bench edit [--json] [--peers] [--runs N] [--backend numpy|mlx] [--mlx-lm-runs N]

A ~2k-token multi-turn conversation (system, 7 user/assistant turns, a last user message).
Each run starts a fresh Engine and sends the conversation (TTFT = a fresh engine's full
prefill), then edits one user message at a time and goes back to the original branch
after each edit (the "< 1/2 >" switch; timed as back_*: our branch cache restores the
original rows, a single-sequence prompt cache re-prefills), so every edit forks from the
conversation the person was looking at. Every user message is edited once: the last one
("edit_last"), the one nearest the middle ("edit_middle"), and the rest give TTFT against
edit depth (tokens from the edit to the end). The same for a random-weight Qwen3.5-style
hybrid (recurrent layers: the edit restores the turn-boundary snapshot and replays), and
with --peers for llama.cpp (same GGUF, same token ids, every edit) and mlx-lm (the last
edit only, --mlx-lm-runs runs: it prefills ~20x slower than llama.cpp on this CPU).

"First message after restart": an Engine with the prompt cache answers the conversation
(a short reply) and closes; a new Engine over the same cache folder takes the next user
message, timed against a fresh Engine without the cache, which prefills the whole chat.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import common
from bench.peers import PeerMissing, make_peers
from engine.config import EngineConfig

NUM_TURNS = 7
WORDS_PER_MESSAGE = 165
Messages = tuple[tuple[str, str], ...]
WARM_UP: Messages = (("user", "Say hello."),)
REPLY_TOKENS = 16  # the reply the first engine gives before it closes


class EngineClient:
    """A blocking client over the Engine's event stream (one request at a time)."""

    def __init__(self, model: Path, config: EngineConfig) -> None:
        from engine import events as ev
        from engine.engine import Engine

        self.ev = ev
        self.events: queue.Queue[Any] = queue.Queue()
        self.engine = Engine(self.events.put, config=config)
        self.engine.submit(ev.LoadModel(str(model)))
        while True:
            event = self.events.get()
            if isinstance(event, ev.ModelLoaded):
                self.loaded = event
                return
            if isinstance(event, ev.Failed):
                raise RuntimeError(f"could not load {model}: {event.message}")

    def first_token(self, messages: Messages, conversation: str = "bench") -> Any:
        """Send the conversation, generate one token; return the request's Stats."""
        return self.reply(messages, 1, conversation).stats

    def reply(self, messages: Messages, max_tokens: int, conversation: str = "bench") -> Any:
        """Send the conversation (greedy, no drafter); return the Finished event."""
        from engine.sampling import SamplingSettings

        ev = self.ev
        sampling = SamplingSettings(temperature=0.0)
        settings = ev.GenerationSettings(sampling, max_tokens=max_tokens, drafter="off")
        msgs = tuple(ev.Message(role, content) for role, content in messages)
        self.engine.submit(ev.Generate(uuid.uuid4().hex, msgs, settings, conversation))
        while True:
            event = self.events.get()
            if isinstance(event, ev.Finished):
                return event
            if isinstance(event, ev.Failed):
                raise RuntimeError(event.message)

    def close(self) -> None:
        self.engine.close()


def edited(messages: Messages, index: int, run: int) -> Messages:
    """The conversation with message `index` rewritten (same length, different words)."""
    role, content = messages[index]
    new = f"Edit {run}: " + common.prose(len(content.split()), seed=10_000 + 97 * run + index)
    return (*messages[:index], (role, new), *messages[index + 1 :])


def render_ids(tokenizer: Any, messages: Messages) -> list[int]:
    from engine.chat_template import render_chat

    dicts = [{"role": r, "content": c} for r, c in messages]
    text = render_chat(
        tokenizer.chat_template,
        dicts,
        add_generation_prompt=True,
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
    )
    return list(tokenizer.encode(text, add_special=tokenizer.add_bos))


def make_conversation(tokenizer: Any) -> tuple[Messages, list[int]]:
    turns = common.conversation(NUM_TURNS, WORDS_PER_MESSAGE)
    turns.append(("user", "Last question: " + common.prose(WORDS_PER_MESSAGE // 3, seed=999)))
    messages = tuple(turns)
    return messages, render_ids(tokenizer, messages)


def edit_targets(tokenizer: Any, messages: Messages, ids: list[int]) -> dict[int, int]:
    """User message index -> edit depth (tokens from the first changed one to the end)."""
    from bench.peers import common_prefix

    depths = {}
    for i, (role, _) in enumerate(messages):
        if role == "user":
            depths[i] = len(ids) - common_prefix(ids, render_ids(tokenizer, edited(messages, i, 0)))
    return depths


def bench_ours(
    model: Path, config: EngineConfig, messages: Messages, targets: dict[int, int], runs: int
) -> list[dict[str, Any]]:
    samples = []
    for run in range(runs):
        client = EngineClient(model, config)
        try:
            client.first_token(WARM_UP)  # first-call costs, on text the conversation lacks
            stats = client.first_token(messages)  # the whole conversation: a full prefill
            sample: dict[str, Any] = {"full": (stats.ttft_s, stats.reused_tokens)}
            for index in sorted(targets, reverse=True):
                stats = client.first_token(edited(messages, index, run + 1))
                sample[index] = (stats.ttft_s, stats.reused_tokens)
                stats = client.first_token(messages)  # back to the original branch
                sample["back", index] = (stats.ttft_s, stats.reused_tokens)
            samples.append(sample)
        finally:
            client.close()
    return samples


def bench_restart(
    model: Path, config: EngineConfig, messages: Messages, runs: int
) -> list[dict[str, Any]]:
    """The next message's TTFT after a restart with the prompt cache, and in a fresh engine
    without it (a full re-prefill). Each engine warms up on a chat of its own first."""
    samples = []
    for run in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            cached = replace(config, prompt_cache_dir=cache)
            client = EngineClient(model, cached)
            try:
                answer = client.reply(messages, REPLY_TOKENS)  # then the window closes
            finally:
                client.close()  # saves the chat's state
            follow_up = "Thank you. " + common.prose(24, seed=500 + run)
            following = (*messages, ("assistant", answer.text), ("user", follow_up))
            sample = {}
            for label, engine_config in (("restart", cached), ("no_cache", config)):
                client = EngineClient(model, engine_config)
                try:
                    client.first_token(WARM_UP, conversation="")
                    stats = client.first_token(following)
                    sample[label] = (stats.ttft_s, stats.reused_tokens, stats.prompt_tokens)
                finally:
                    client.close()
            samples.append(sample)
    return samples


def summarize_restart(samples: list[dict[str, Any]]) -> dict[str, Any]:
    restart = common.spread([s["restart"][0] for s in samples])
    full = common.spread([s["no_cache"][0] for s in samples])
    _, reused, prompt = samples[0]["restart"]
    return {
        "restart_ttft_s": restart["median"],
        "restart_full_reprefill_ttft_s": full["median"],
        "speedup_restart": full["median"] / restart["median"],
        "restart_prompt_tokens": prompt,
        "restart_reused_tokens": reused,
        "restart_spread": {"restart_ttft_s": restart, "full_reprefill_ttft_s": full},
    }


def bench_peer(
    runner: Any, tokenizer: Any, messages: Messages, targets: dict[int, int], runs: int
) -> list[dict[str, Any]]:
    ids = render_ids(tokenizer, messages)
    samples = []
    for run in range(runs):
        t0 = time.perf_counter()
        runner.prefill(ids)
        sample: dict[str, Any] = {"full": (time.perf_counter() - t0, 0)}
        for index in sorted(targets, reverse=True):
            new_ids = render_ids(tokenizer, edited(messages, index, run + 1))
            t0 = time.perf_counter()
            runner.prefill_cached(new_ids)
            sample[index] = (time.perf_counter() - t0, None)
            t0 = time.perf_counter()
            runner.prefill_cached(ids)  # back to the original conversation
            sample["back", index] = (time.perf_counter() - t0, None)
        samples.append(sample)
    return samples


def last_and_middle(targets: dict[int, int], num_tokens: int) -> tuple[int, int]:
    """The last user message, and the one whose edit depth is nearest half the tokens."""
    last = max(targets)
    return last, min(targets, key=lambda i: abs(targets[i] - num_tokens / 2))


def summarize(
    samples: list[dict[str, Any]],
    targets: dict[int, int],
    num_tokens: int,
    named: dict[str, int],
) -> dict[str, Any]:
    """Medians of every timed request; `named` maps "last" / "middle" to message indices."""

    def ttft(key: Any) -> dict[str, float]:
        return common.spread([s[key][0] for s in samples])

    full = ttft("full")
    out: dict[str, Any] = {
        "conversation_tokens": num_tokens,
        "full_reprefill_ttft_s": full["median"],
    }
    spread = {"full_reprefill_ttft_s": full}
    reused: dict[str, Any] = {"full": samples[0]["full"][1]}
    for label, index in named.items():
        out[f"edit_{label}_ttft_s"] = ttft(index)["median"]
        out[f"back_after_edit_{label}_ttft_s"] = ttft(("back", index))["median"]
        out[f"edit_{label}_depth_tokens"] = targets[index]
        out[f"speedup_{label}"] = full["median"] / ttft(index)["median"]
        spread[f"edit_{label}_ttft_s"] = ttft(index)
        reused[f"edit_{label}"] = samples[0][index][1]
    if reused["full"] is not None:  # peers do not report it
        out["reused_tokens"] = reused
    out["depth_curve"] = [
        {"depth_tokens": targets[i], "ttft_s": ttft(i)["median"], "min": ttft(i)["min"],
         "max": ttft(i)["max"], "back_ttft_s": ttft(("back", i))["median"]}
        for i in sorted(targets, key=lambda i: targets[i])
    ] + [{"depth_tokens": num_tokens, "ttft_s": full["median"], "min": full["min"],
          "max": full["max"], "full_prefill": True}]  # fmt: skip
    out["spread"] = spread
    out["runs"] = len(samples)
    return out


def run(args: argparse.Namespace, config: EngineConfig) -> dict[str, Any]:
    from engine.tokenizer import Tokenizer

    # the load average and the checkout as the run starts
    common.warn_if_busy()
    machine, versions, date = common.machine(), common.versions(), common.now_iso()
    gguf = common.default_model()
    result: dict[str, Any] = {"command": _command(args), "date": date}
    with tempfile.TemporaryDirectory() as tmp:
        mlx_dir = common.converted_default_model(Path(tmp))
        tokenizer = Tokenizer.from_dir(mlx_dir)  # token-identical to the GGUF's (tested)
        messages, ids = make_conversation(tokenizer)
        targets = edit_targets(tokenizer, messages, ids)
        _say(args, f"conversation: {len(ids)} tokens; edit depths {sorted(targets.values())}")
        _say(args, "ours (default model)...")
        last, middle = last_and_middle(targets, len(ids))
        named = {"last": last, "middle": middle}
        ours = bench_ours(gguf, config, messages, targets, args.runs)
        result.update(summarize(ours, targets, len(ids), named))
        _say(args, "ours (default model), first message after a restart...")
        result.update(summarize_restart(bench_restart(gguf, config, messages, args.runs)))
        _say(args, "ours (hybrid)...")
        hybrid_dir = common.write_hybrid_model(Path(tmp) / "hybrid", mlx_dir)
        hybrid = bench_ours(hybrid_dir, config, messages, targets, args.runs)
        result["hybrid"] = {
            "model": "random-weight Qwen3.5-style hybrid (3 Gated DeltaNet : 1 gated attention)",
            "config": {k: v for k, v in common.HYBRID_CONFIG.items() if k != "architectures"},
            **summarize(hybrid, targets, len(ids), named),
        }
        _say(args, "ours (hybrid), first message after a restart...")
        restart = bench_restart(hybrid_dir, config, messages, args.runs)
        result["hybrid"].update(summarize_restart(restart))
        if args.peers:
            runners, missing = make_peers(["llama_cpp", "mlx_lm"], gguf, mlx_dir)
            for name, why in missing.items():
                print(f"{name}: {why}", file=sys.stderr)
                result[name] = {"missing": why}
            for runner in runners:
                _say(args, f"{runner.name}...")
                # mlx-lm prefills ~10-30x slower than llama.cpp here: the last edit only
                peer_named, peer_targets, runs = named, targets, args.runs
                if runner.name == "mlx_lm":
                    peer_named = {"last": last}
                    peer_targets, runs = {last: targets[last]}, args.mlx_lm_runs
                try:
                    samples = bench_peer(runner, tokenizer, messages, peer_targets, runs)
                except PeerMissing as exc:
                    result[runner.name] = {"missing": str(exc)}
                    continue
                summary = summarize(samples, peer_targets, len(ids), peer_named)
                if getattr(runner, "cannot_trim", ""):
                    summary["note"] = runner.cannot_trim
                summary["ours_speedup_edit_last"] = (
                    summary["edit_last_ttft_s"] / result["edit_last_ttft_s"]
                )
                result[runner.name] = summary
    result["machine"] = {**machine, "load_average_1m_end": round(os.getloadavg()[0], 2)}
    result["versions"] = versions
    result["model"] = common.model_info(gguf)
    result["runs"] = args.runs
    return common.rounded(result)


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        print(text, file=sys.stderr, flush=True)


def _command(args: argparse.Namespace) -> str:
    parts = ["python -m bench edit", *(["--peers"] if args.peers else [])]
    parts.append(f"--runs {args.runs}")
    if args.peers and args.mlx_lm_runs != 1:
        parts.append(f"--mlx-lm-runs {args.mlx_lm_runs}")
    if args.backend:
        parts.append(f"--backend {args.backend}")
    return " ".join(parts)


def print_summary(result: dict[str, Any]) -> None:
    rows = [("ours", result), ("ours (hybrid)", result["hybrid"])]
    rows += [(n, result[n]) for n in ("llama_cpp", "mlx_lm") if n in result]
    print(f"conversation: {result['conversation_tokens']} tokens")
    header = ("full (s)", 10), ("edit last", 11), ("edit mid", 10), ("x last", 8), ("x mid", 8)
    header += (("back mid", 10), ("restart", 9), ("x restart", 11))
    print(f"{'engine':<16}" + "".join(f"{h:>{w}}" for h, w in header))
    for name, r in rows:
        if "missing" in r:
            print(f"{name:<16}{r['missing']}")
            continue
        cells = [
            f"{r['full_reprefill_ttft_s']:>10.3f}",
            f"{r['edit_last_ttft_s']:>11.3f}",
            f"{r['edit_middle_ttft_s']:>10.3f}" if "edit_middle_ttft_s" in r else f"{'-':>10}",
            f"{r['speedup_last']:>8.1f}",
            f"{r['speedup_middle']:>8.1f}" if "speedup_middle" in r else f"{'-':>8}",
            f"{r['back_after_edit_middle_ttft_s']:>10.3f}"
            if "back_after_edit_middle_ttft_s" in r
            else f"{'-':>10}",
            f"{r['restart_ttft_s']:>9.3f}" if "restart_ttft_s" in r else f"{'-':>9}",
            f"{r['speedup_restart']:>11.1f}" if "speedup_restart" in r else f"{'-':>11}",
        ]
        print(f"{name:<16}" + "".join(cells))


def main(argv: list[str] | None = None, config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench edit", description=__doc__)
    parser.add_argument("--peers", action="store_true", help="also run llama.cpp and mlx-lm")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=3, help="runs to take the median of")
    parser.add_argument("--mlx-lm-runs", type=int, default=1, help="runs for mlx-lm (slow)")
    parser.add_argument("--backend", choices=("numpy", "mlx"), default=None)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.mlx_lm_runs < 1:
        parser.error("--runs must be >= 1")
    result = run(args, common.engine_config(config, args.backend))
    return common.report("edit", result, args.json, print_summary)
