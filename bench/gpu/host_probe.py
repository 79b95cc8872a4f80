"""Debug probe: where a decode step's host time goes (any backend; on the GPU the part
of a step that is not the kernel).

Loads a GGUF model as the engine does, prefills `--context` tokens, then times greedy
decode steps one forward at a time (the runner's forward, the argmax on the device, one
int back), or with `--loop` through the engine's decode loop as a reply takes them (each
step queued before the host reads its token; `--temperature` > 0: sampled, the host's
float64 draw from the row beside the device's draw), once plainly and once under
cProfile. Prints JSON: the step's mean wall time, and the functions that take most of
it, by own time and by time with callees, in us a step (cProfile's overhead inflates
these; their ranking is the point).

    python -m bench.gpu.host_probe --model PATH [--context 128] [--steps 200] [--top 25]
        [--loop [--temperature 0.7 --top-p 0.95]]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from typing import Any

import numpy as np

from engine.config import EngineConfig
from engine.decoding import DecodeRequest, decode
from engine.draft_costs import CostModel
from engine.loader import load_model
from engine.sampling import SamplingSettings
from engine.sequence import prefill


def _decode(runner: Any, ops: Any, state: Any, token: int, steps: int) -> int:
    for _ in range(steps):
        token = int(ops.argmax_rows(runner.forward([token], state))[-1])
    return token


def _loop(
    runner: Any, state: Any, vocab: int, token: int, steps: int, settings: SamplingSettings
) -> int:
    """`steps` forwards through the engine's decode loop from `token`, no drafter."""
    first = np.full(vocab, -np.inf)
    first[token] = 0.0  # the loop's first token is `token` again, whatever the settings
    req = DecodeRequest(settings, steps + 1, frozenset(), lambda *_: None, lambda: False)
    return decode(runner, state, first, req, CostModel()).token_ids[-1]


def _rows(stats: pstats.Stats, key: str, steps: int, top: int) -> list[dict[str, Any]]:
    """The `top` functions by `key` ("tottime" or "cumtime"), us a step."""
    entries = stats.stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, callers)}
    index = {"tottime": 2, "cumtime": 3}[key]
    ranked = sorted(entries.items(), key=lambda kv: kv[1][index], reverse=True)[:top]
    return [
        {
            "function": f"{file.rsplit('/', 2)[-1]}:{line}:{name}",
            "calls_a_step": round(nc / steps, 2),
            "own_us": round(tt / steps * 1e6, 1),
            "with_callees_us": round(ct / steps * 1e6, 1),
        }
        for (file, line, name), (_, nc, tt, ct, _) in ranked
    ]


def probe(
    path: str, context: int, steps: int, top: int, settings: SamplingSettings | None = None
) -> dict[str, Any]:
    """`settings`: steps through the decode loop with these; None: one forward a step."""
    lm = load_model(path, EngineConfig.from_environment())
    runner, ops = lm.runner, lm.ops
    state = runner.new_state()
    logits = prefill(runner, state, [3 + (7 * i) % 90 for i in range(context)])

    def run(token: int, n: int) -> int:
        if settings is None:
            return _decode(runner, ops, state, token, n)
        return _loop(runner, state, lm.config.vocab_size, token, n, settings)

    token = run(int(ops.argmax_rows(logits)[-1]), 10)  # warm
    t0 = time.perf_counter()
    token = run(token, steps)
    wall_us = (time.perf_counter() - t0) / steps * 1e6
    profiler = cProfile.Profile()
    profiler.enable()
    run(token, steps)
    profiler.disable()
    stats = pstats.Stats(profiler)
    return {
        "model": path,
        "path": getattr(runner, "last_path", None),
        "loop": None if settings is None else repr(settings),
        "context": context,
        "steps": steps,
        "step_us": round(wall_us, 1),
        "profiled_step_us": round(stats.total_tt / steps * 1e6, 1),  # type: ignore[attr-defined]
        "by_own_time": _rows(stats, "tottime", steps, top),
        "by_time_with_callees": _rows(stats, "cumtime", steps, top),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a .gguf file")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--loop", action="store_true", help="through the engine's decode loop")
    ap.add_argument("--temperature", type=float, default=0.0, help="with --loop")
    ap.add_argument("--top-p", type=float, default=1.0, help="with --loop")
    args = ap.parse_args()
    settings = SamplingSettings(temperature=args.temperature, top_p=args.top_p, seed=0)
    if not args.loop and not settings.is_greedy:
        ap.error("--temperature samples through the decode loop: add --loop")
    result = probe(args.model, args.context, args.steps, args.top, settings if args.loop else None)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
