"""Speculative decoding on the default model: plain decoding against lookup drafting.

    python -m bench speculative [--json] [--runs N] [--backend numpy|mlx] [--max-tokens N]

Workloads (greedy, so both modes must produce the same tokens):
- regenerate: ask a question, then the same question with one word changed (an edit and
  regenerate); the second answer is measured.
- chat: a fresh question in a fresh session; the drafter has little to go on there, so
  speculation must cost next to nothing.
- code: ask for a function, then the same request with the function renamed.

Fairness: the lookup drafter learns from every request its session saw, so every measured
request runs in its own fresh Session that first ran the workload's earlier request, in the
same mode (drafter "off" or "auto"; without a draft model "auto" is the lookup drafter).
Both modes therefore see the same token history. Every Session starts from one shared
calibration of the forward cost (what Engine does at model load), and the modes alternate
run by run so a burst of load hits both. Throughput is the engine's own decode tok/s of
the measured request (after its first token); figures are medians over --runs.
"""

from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import dataclass
from typing import Any

from bench import common
from engine.config import EngineConfig

MODES = {"plain": "off", "spec": "auto"}


@dataclass(frozen=True)
class Workload:
    earlier: tuple[str, ...]  # requests the session ran before the measured one
    measured: str


WORKLOADS = {
    "regenerate": Workload(
        ("What are the main differences between a list and a tuple in Python?",),
        "What are the key differences between a list and a tuple in Python?",
    ),
    "chat": Workload((), "Explain how photosynthesis works, step by step."),
    "code": Workload(
        ("Write a Python function fibonacci(n) that returns the n-th Fibonacci number.",),
        "Write a Python function fib(n) that returns the n-th Fibonacci number.",
    ),
}


@dataclass
class Sample:
    tok_s: float
    token_ids: tuple[int, ...]
    drafted: int
    accepted: int


def ask(session: Any, question: str, drafter: str, max_tokens: int) -> Any:
    """One greedy request on `session`; its Finished event."""
    from engine import events as ev

    events: list[Any] = []
    settings = ev.GenerationSettings(max_tokens=max_tokens, drafter=drafter)
    cmd = ev.Generate("bench", (ev.Message("user", question),), settings)
    session.generate(cmd, events.append, lambda: False)
    failed = [e for e in events if isinstance(e, ev.Failed)]
    if failed:
        raise RuntimeError(failed[0].message)
    return next(e for e in events if isinstance(e, ev.Finished))


def measure(
    loaded: Any, config: EngineConfig, costs: Any, work: Workload, mode: str, max_tokens: int
) -> Sample:
    """A fresh session runs the earlier requests, then the measured one."""
    from engine.session import Session

    session = Session(loaded, config=config)
    session.costs = copy.deepcopy(costs)
    for question in work.earlier:
        ask(session, question, MODES[mode], max_tokens)
    done = ask(session, work.measured, MODES[mode], max_tokens)
    stats = done.stats
    return Sample(stats.decode_tok_s, done.token_ids, stats.drafted, stats.accepted)


def summarize(samples: dict[str, list[Sample]]) -> dict[str, Any]:
    plain, spec = samples["plain"], samples["spec"]
    plain_tok_s = common.spread([s.tok_s for s in plain])
    spec_tok_s = common.spread([s.tok_s for s in spec])
    drafted = sum(s.drafted for s in spec)
    accepted = sum(s.accepted for s in spec)
    reference = plain[0].token_ids
    return {
        "plain_tok_s": plain_tok_s,
        "spec_tok_s": spec_tok_s,
        "speedup": spec_tok_s["median"] / plain_tok_s["median"],
        "speedup_per_run": common.spread(
            [s.tok_s / p.tok_s for s, p in zip(spec, plain, strict=True)]
        ),
        "acceptance": accepted / drafted if drafted else 0.0,
        "drafted": drafted,
        "accepted": accepted,
        "identical": all(s.token_ids == reference for s in [*plain, *spec]),
        "tokens": len(reference),
    }


def run(args: argparse.Namespace, config: EngineConfig) -> dict[str, Any]:
    from engine.loader import load_model
    from engine.session import Session

    path = common.default_model()
    load_at_start = common.machine()["load_average_1m"]
    loaded = load_model(path, config)
    calibration = Session(loaded, config=config)
    calibration.calibrate()
    costs = calibration.costs
    samples = {name: {mode: [] for mode in MODES} for name in WORKLOADS}
    for run_index in range(args.runs):
        for name, work in WORKLOADS.items():
            modes = list(MODES) if run_index % 2 == 0 else list(reversed(MODES))
            for mode in modes:
                sample = measure(loaded, config, costs, work, mode, args.max_tokens)
                samples[name][mode].append(sample)
                print(
                    f"run {run_index + 1}/{args.runs} {name:<10} {mode:<5} "
                    f"{sample.tok_s:6.1f} tok/s  {len(sample.token_ids)} tokens  "
                    f"accepted {sample.accepted}/{sample.drafted}",
                    file=sys.stderr,
                )
    result: dict[str, Any] = {
        "command": _command(args),
        "date": common.now_iso(),
        "workloads": {name: summarize(s) for name, s in samples.items()},
        "prompts": {
            name: {"earlier": w.earlier, "measured": w.measured} for name, w in WORKLOADS.items()
        },
        "calibrated_cost_s": {str(rows): s for rows, s in sorted(costs.seconds.items())},
        "settings": {"runs": args.runs, "max_tokens": args.max_tokens, "modes": MODES},
        "machine": {**common.machine(), "load_average_1m_at_start": load_at_start},
        "versions": common.versions(),
        "model": {**common.model_info(path), "backend": loaded.ops.name},
    }
    return common.rounded(result)


def _command(args: argparse.Namespace) -> str:
    parts = ["python -m bench speculative", f"--runs {args.runs}"]
    parts.append(f"--max-tokens {args.max_tokens}")
    if args.backend:
        parts.append(f"--backend {args.backend}")
    return " ".join(parts)


def print_table(result: dict[str, Any]) -> None:
    head = f"{'workload':<12}{'plain tok/s':>13}{'spec tok/s':>13}{'speedup':>9}"
    print(head + f"{'accept':>8}{'identical':>11}{'tokens':>8}")
    for name, w in result["workloads"].items():
        plain, spec = w["plain_tok_s"], w["spec_tok_s"]
        print(
            f"{name:<12}{plain['median']:>13.1f}{spec['median']:>13.1f}{w['speedup']:>8.2f}x"
            f"{w['acceptance']:>8.2f}{str(w['identical']):>11}{w['tokens']:>8}"
        )
    runs = result["settings"]["runs"]
    print(
        f"medians of {runs} runs; model {result['model']['name']} on {result['model']['backend']}"
    )


def main(argv: list[str] | None = None, config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench speculative", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=3, help="runs to take the median of")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per answer")
    parser.add_argument("--backend", choices=("numpy", "mlx"), default=None)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.max_tokens < 2:
        parser.error("--runs must be >= 1 and --max-tokens >= 2")
    result = run(args, common.engine_config(config, args.backend))
    return common.report("speculative", result, args.json, print_table)
