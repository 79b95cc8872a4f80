"""Speculative decoding on the default model (or --model's): plain decoding against drafting.

    python -m bench speculative [--json] [--runs N] [--backend numpy|mlx] [--max-tokens N]
                                [--modes plain,auto,block,lookup,draft] [--workloads a,b]
                                [--model GGUF] [--draft-model GGUF]
                                [--temperature T --top-p P --seed S]

Workloads (greedy by default, so every mode must produce the same tokens):
- regenerate: ask a question, then the same question with one word changed (an edit and
  regenerate); the second answer is measured.
- chat: a fresh question in a fresh session; the drafter has little to go on there, so
  speculation must cost next to nothing.
- code: ask for a function, then the same request with the function renamed.
- repeat (only when named): a question, then the same question again (regenerate without an
  edit): greedy, the reply repeats, so lookup has every token and the speed-up is the
  verify curve's ceiling (a random-weight shape's replies share nothing across an edit).
- open_chat: ten fresh questions held out from the block drafter's training
  (bench/heldout_prompts.json), each in a fresh session.
- mixed: ten held-out conversations of chat, code, lists and follow-ups (each earlier turn
  answered by the model, the last one measured).

Modes: plain (drafter off), auto (what the engine picks: prompt lookup, and with
--draft-model, that model in every mode's session, so auto pools it too), draft (the draft
model alone), block (the
block drafter pooled with prompt lookup, each round the one promising more:
engine/drafter_pool.py), lookup (prompt lookup alone). Fairness: the lookup drafter learns
from every request its session saw, so every measured conversation runs in its own fresh
Session that first ran the conversation's earlier requests, in the same mode;
all modes see the same token history. Every Session starts from one shared calibration of
the forward cost (what Engine does at model load), each mode answers one short untimed
request first, and the modes rotate run by run so a burst of load hits each. Throughput
is the engine's own decode rate of the measured requests (tokens after the first over
decode seconds, summed over a workload's conversations); figures are medians over
--runs. `--temperature T --top-p P --seed S` samples instead (what the app does by
default: 0.7 and 0.95): every request draws from the same seeded uniforms, and
"identical" is n/a, since a sampled verify keeps the distribution, not each draw."""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import block_pass_time, common
from engine.config import EngineConfig
from engine.sampling import SamplingSettings

ALL_MODES = {
    "plain": "off",
    "auto": "auto",
    "block": "block",
    "lookup": "lookup",
    "draft": "draft_model",
}
HELD_OUT = json.loads((Path(__file__).parent / "heldout_prompts.json").read_text())


Step = tuple[tuple[str, str], ...]  # the (role, content) messages one request adds


@dataclass(frozen=True)
class Workload:
    conversations: tuple[tuple[Step, ...], ...]  # each a session's requests, the last measured
    follow_up: bool = False  # a request carries the earlier ones and the model's replies


def _user(*turns: str) -> tuple[Step, ...]:
    return tuple((("user", turn),) for turn in turns)


WORKLOADS = {
    "regenerate": Workload(
        (
            _user(
                "What are the main differences between a list and a tuple in Python?",
                "What are the key differences between a list and a tuple in Python?",
            ),
        )
    ),
    "chat": Workload((_user("Explain how photosynthesis works, step by step."),)),
    "repeat": Workload((_user(*["What is the difference between a list and a tuple?"] * 2),)),
    "code": Workload(
        (
            _user(
                "Write a Python function fibonacci(n) that returns the n-th Fibonacci number.",
                "Write a Python function fib(n) that returns the n-th Fibonacci number.",
            ),
        )
    ),
    "open_chat": Workload(
        tuple(
            (tuple((m["role"], m["content"]) for m in chat["messages"]),)
            for chat in HELD_OUT["open_chat"]
        )
    ),
    "mixed": Workload(tuple(_user(*turns) for turns in HELD_OUT["mixed"]), follow_up=True),
}
DEFAULT_WORKLOADS = [w for w in WORKLOADS if w != "repeat"]  # repeat: a ceiling, asked by name


@dataclass
class Sample:
    tokens: int  # decoded after each measured request's first token, summed
    seconds: float
    token_ids: tuple[tuple[int, ...], ...]
    drafted: int
    accepted: int
    verifies: int = 0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def ask(
    session: Any, messages: tuple[Any, ...], drafter: str, max_tokens: int, sampling: Any = None
) -> Any:
    """One request on `session` (greedy unless `sampling` says otherwise); its Finished."""
    from engine import events as ev

    events: list[Any] = []
    sampling = sampling or SamplingSettings()
    settings = ev.GenerationSettings(max_tokens=max_tokens, drafter=drafter, sampling=sampling)
    session.generate(ev.Generate("bench", messages, settings), events.append, lambda: False)
    failed = [e for e in events if isinstance(e, ev.Failed)]
    if failed:
        raise RuntimeError(failed[0].message)
    return next(e for e in events if isinstance(e, ev.Finished))


def converse(
    session: Any,
    steps: tuple[Any, ...],
    follow_up: bool,
    drafter: str,
    max_tokens: int,
    sampling: Any = None,
    before_each: Callable[[], None] = lambda: None,
) -> Any:
    """A conversation's requests on `session` in order (each with the replies before it,
    where `follow_up`), `before_each` called before each; the last one's Finished."""
    from engine import events as ev

    history: tuple[Any, ...] = ()
    for step in steps:
        added = tuple(ev.Message(role, content) for role, content in step)
        messages = (*history, *added) if follow_up else added
        before_each()
        done = ask(session, messages, drafter, max_tokens, sampling)
        history = (*messages, ev.Message("assistant", done.text))
    return done


def measure(
    loaded: Any,
    config: EngineConfig,
    costs: Any,
    work: Workload,
    drafter: str,
    max_tokens: int,
    sampling: Any = None,
    draft: Any = None,
) -> Sample:
    """Each conversation in a fresh session (with the draft model `draft`, if any): its
    earlier requests, then the measured one."""
    sample = Sample(0, 0.0, (), 0, 0)
    for steps in work.conversations:
        session = fresh_session(loaded, draft, config, costs)
        done = converse(session, steps, work.follow_up, drafter, max_tokens, sampling)
        stats = done.stats
        decoded = max(0, stats.generated_tokens - 1)
        sample.tokens += decoded
        sample.seconds += decoded / stats.decode_tok_s if stats.decode_tok_s else 0.0
        sample.token_ids += (done.token_ids,)
        sample.drafted += stats.drafted
        sample.accepted += stats.accepted
        sample.verifies += stats.verifies
    return sample


def summarize(samples: dict[str, list[Sample]], greedy: bool = True) -> dict[str, Any]:
    """Per mode, against plain decoding; `identical` (every run's tokens plain's) only for
    greedy runs: a sampled verify keeps the distribution, not each draw."""
    plain = samples["plain"]
    reference = plain[0].token_ids
    same = all(s.token_ids == reference for runs in samples.values() for s in runs)
    out: dict[str, Any] = {
        "plain_tok_s": common.spread([s.tok_s for s in plain]),
        "tokens": sum(len(ids) for ids in reference),
        "identical": same if greedy else None,
    }
    for mode, runs in samples.items():
        if mode == "plain":
            continue
        drafted = sum(s.drafted for s in runs)
        accepted = sum(s.accepted for s in runs)
        verifies = sum(s.verifies for s in runs)
        tok_s = common.spread([s.tok_s for s in runs])
        out[mode] = {
            "tok_s": tok_s,
            "speedup": tok_s["median"] / out["plain_tok_s"]["median"],
            "speedup_per_run": common.spread(
                [s.tok_s / p.tok_s for s, p in zip(runs, plain, strict=True)]
            ),
            "acceptance": accepted / drafted if drafted else 0.0,
            # tokens a verify yields: the accepted drafts and the target's own token
            "acceptance_length": (accepted + verifies) / verifies if verifies else 0.0,
            "drafted": drafted,
            "accepted": accepted,
            "verifies": verifies,
        }
    return out


def fresh_session(loaded: Any, draft: Any, config: EngineConfig, costs: Any) -> Any:
    """A Session starting from the shared calibration (a copy: each learns its own)."""
    from engine.session import Session

    session = Session(loaded, draft, config=config)
    session.costs = copy.deepcopy(costs)
    return session


def warm_up(
    loaded: Any,
    draft: Any,
    config: EngineConfig,
    costs: Any,
    work: Workload,
    modes: dict[str, str],
    sampling: SamplingSettings,
) -> None:
    """One short untimed request a mode, with the run's sampling: a GPU's first sampled
    step compiles the device's draw, and session 29's H100 put the first workload's plain
    run at 563 tok/s against 1,021 after it, so Auto read 1.78x on a fresh question."""
    from engine import events as ev

    messages = tuple(ev.Message(role, content) for role, content in work.conversations[0][0])
    for drafter in modes.values():
        ask(fresh_session(loaded, draft, config, costs), messages, drafter, 16, sampling)


def run(args: argparse.Namespace, config: EngineConfig) -> dict[str, Any]:
    from engine.loader import load_model
    from engine.session import Session

    path = common.model_file(args.model)
    load_at_start = common.machine()["load_average_1m"]
    loaded = load_model(path, config)
    draft = load_model(args.draft_model, config) if args.draft_model else None
    if ("draft" in args.modes) != (draft is not None):
        raise SystemExit("the draft mode and --draft-model go together")
    calibration = Session(loaded, draft, config=config)
    calibration.calibrate()
    costs = calibration.costs
    modes = {name: ALL_MODES[name] for name in args.modes}
    sampling = SamplingSettings(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    if "block" in modes and calibration.block_drafter is None:
        raise SystemExit(
            calibration.block_problem or f"{loaded.name} has no block drafter: drop 'block'"
        )
    workloads = {name: WORKLOADS[name] for name in args.workloads}
    samples: dict[str, dict[str, list[Sample]]] = {
        name: {mode: [] for mode in modes} for name in workloads
    }
    warm_up(loaded, draft, config, costs, next(iter(workloads.values())), modes, sampling)
    for run_index in range(args.runs):
        for name, work in workloads.items():
            order = list(modes)
            order = order[run_index % len(order) :] + order[: run_index % len(order)]
            for mode in order:
                sample = measure(
                    loaded, config, costs, work, modes[mode], args.max_tokens, sampling, draft
                )
                samples[name][mode].append(sample)
                print(
                    f"run {run_index + 1}/{args.runs} {name:<10} {mode:<6} "
                    f"{sample.tok_s:6.1f} tok/s  {sample.tokens} tokens  "
                    f"accepted {sample.accepted}/{sample.drafted}",
                    file=sys.stderr,
                )
    block = calibration.block_drafter
    result: dict[str, Any] = {
        "command": _command(args),
        "date": common.now_iso(),
        "workloads": {name: summarize(s, sampling.is_greedy) for name, s in samples.items()},
        "prompts": {name: w.conversations for name, w in workloads.items()},
        "calibrated_cost_s": {str(rows): s for rows, s in sorted(costs.seconds.items())},
        "settings": {
            "runs": args.runs,
            "max_tokens": args.max_tokens,
            "modes": modes,
            "sampling": asdict(sampling),
        },
        "block_drafter": None if block is None else {"file": block.w.path.name, **block.w.meta},
        **({} if block is None else block_pass_time.pass_times(block, sampling)),
        "draft_model": None if draft is None else common.model_info(Path(args.draft_model)),
        "machine": {**common.machine(), "load_average_1m_at_start": load_at_start},
        "versions": common.versions(),
        "model": {**common.model_info(path), "backend": loaded.ops.name},
    }
    return common.rounded(result)


def _command(args: argparse.Namespace) -> str:
    parts = ["python -m bench speculative", f"--runs {args.runs}"]
    if args.model:
        parts.append(f"--model {args.model}")
    parts.append(f"--max-tokens {args.max_tokens}")
    parts.append(f"--modes {','.join(args.modes)}")
    parts.append(f"--workloads {','.join(args.workloads)}")
    if args.backend:
        parts.append(f"--backend {args.backend}")
    if args.draft_model:
        parts.append(f"--draft-model {args.draft_model}")
    if args.temperature:
        parts.append(f"--temperature {args.temperature} --top-p {args.top_p} --seed {args.seed}")
    return " ".join(parts)


def print_table(result: dict[str, Any]) -> None:
    modes = [m for m in result["settings"]["modes"] if m != "plain"]
    head = f"{'workload':<12}{'plain tok/s':>13}"
    for mode in modes:
        head += f"{mode + ' tok/s':>13}{'speedup':>9}{'accept':>8}{'a. len':>8}"
    print(head + f"{'identical':>11}{'tokens':>8}")
    for name, w in result["workloads"].items():
        line = f"{name:<12}{w['plain_tok_s']['median']:>13.1f}"
        for mode in modes:
            m = w[mode]
            line += f"{m['tok_s']['median']:>13.1f}{m['speedup']:>8.2f}x{m['acceptance']:>8.2f}"
            line += f"{m['acceptance_length']:>8.2f}"
        same = "n/a" if w["identical"] is None else str(w["identical"])
        print(line + f"{same:>11}{w['tokens']:>8}")
    runs = result["settings"]["runs"]
    print(
        f"medians of {runs} runs; model {result['model']['name']} on {result['model']['backend']}"
        "; a. len: tokens a verify yields"
    )


def _names(choices: dict[str, Any]) -> Any:
    def parse(value: str) -> list[str]:
        names = [v for v in value.split(",") if v]
        unknown = [v for v in names if v not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}")
        return names

    return parse


def main(argv: list[str] | None = None, config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench speculative", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=3, help="runs to take the median of")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per answer")
    parser.add_argument("--backend", choices=("numpy", "mlx"), default=None)
    parser.add_argument(
        "--modes", type=_names(ALL_MODES), default=["plain", "auto"], help="plain is always run"
    )
    parser.add_argument("--workloads", type=_names(WORKLOADS), default=DEFAULT_WORKLOADS)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0, help="a sampled run's draws")
    parser.add_argument(
        "--model", help="a .gguf file or a shipped model's name (default: the default model)"
    )
    parser.add_argument(
        "--draft-model", default=None, help="a GGUF drafting for the model (mode draft)"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.max_tokens < 2:
        parser.error("--runs must be >= 1 and --max-tokens >= 2")
    if "plain" not in args.modes:
        args.modes = ["plain", *args.modes]
    result = run(args, common.engine_config(config, args.backend))
    return common.report("speculative", result, args.json, print_table)
