"""Speculation priced by another machine's costs: what Auto's drafting would gain there.

A GPU round's `python -m bench speculative --json` records the forward costs it calibrated
(`calibrated_cost_s`: seconds for 1, 2, 4, 8 and 16 rows) and plain decoding's speed. This
bench decodes the workloads here, every reply checked against plain decoding's, with the
decode loop's cost model fixed to that table (it weighs each draft with the GPU's prices,
not this machine's), and prices every forward it ran by the same table: a plain step at
plain decoding's measured step, the first step after a verify at the table's one-row cost
(the verify stopped the queue), a verify of m rows at the table's m rows. Drafting policies
can then be compared here against a GPU's verify curve, between rounds on a lent GPU.

Modes whose drafts cost no forward only (plain, Auto, lookup: a block drafter's pass or a
draft model's forwards would run at this machine's cost). A model, not a measurement: it
assumes the GPU decodes the same tokens (greedy; the GPU's bfloat16 may part from this
machine's float32 on a near tie) and that a forward's cost does not depend on the context.
On session 36's H100 Llama-3.2-1B shape it read a fresh chat at 0.87x, regenerate 1.05x and
a repeated question 1.61x, where the H100 measured 0.83x, 1.03x and 1.45x.

`--queue` (the GPU's way until session 46, engine/runner/ahead.py) prices what this CPU's
synchronous loop does not run: a plain step is queued on the device before its token is
read, so a draft proposed on that token threw the queued step away, which the device
computes all the same. A verify whose forward before was one row then costs one plain step
more. Since session 46 that step is the verify's first row (engine/decoding.py) and the cut
prices it there (`cut_draft(queued=True)`), which this synchronous loop does not replay:
`--queue` reads the engine before that change, an upper bound on what a draft costs now.

    python -m bench priced --costs docs/h100/speculative-llama-3.2-1b-20261206-s36.json \
        --model llama-3.2-1b.gguf [--workloads chat,regenerate,repeat] [--queue] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench import common
from bench.speculative import ALL_MODES, WORKLOADS, Workload, _names, converse, fresh_session
from engine.config import EngineConfig
from engine.draft_costs import CostModel
from engine.runner import ModelRunner

# modes whose drafts cost no forward (prompt lookup's): a block drafter's pass or a draft
# model's forwards run on this machine at its own cost, which the table cannot price
FREE_MODES = {mode: ALL_MODES[mode] for mode in ("plain", "auto", "lookup")}


class PricedCosts(CostModel):
    """A cost model fixed to a table: the decode loop's observations are recorded as the
    forwards it ran (rows each; a step restarted after a verify, which the loop charges
    to the verify, as one row), never learned from."""

    def __init__(self, table: dict[int, float], step: float, queued: bool = False) -> None:
        super().__init__(decay=1.0)
        self.step_seconds = step
        self.ratios = {1: 1.0} | {m: s / step for m, s in table.items() if m > 1}
        self.one_row = table[1]  # a step that waits for its kernel (after a verify)
        self.queued = queued  # plain steps queued: a verify after one throws one away
        self.forwards: list[int] = []

    def observe(self, rows: int, seconds: float) -> None:
        self.forwards.append(rows)

    def charge(self, rows: int, seconds: float) -> None:
        self.forwards.append(1)  # the restart after a verify: a plain step all the same

    def forget(self) -> None:
        """Forwards recorded so far are dropped (a request before the measured one)."""
        self.forwards = []

    def calibrate(self, runner: ModelRunner) -> None:
        raise RuntimeError("a priced cost model is fixed to its table: nothing to calibrate")

    def price(self, forwards: list[int]) -> float:
        """Seconds the forwards take at the table's prices."""
        seconds, last = 0.0, 0
        for rows in forwards:
            if rows == 1:
                seconds += self.one_row if last > 1 else self.step_seconds
            else:
                seconds += self.cost(rows)
                if self.queued and last == 1:  # the step queued on its first row's token
                    seconds += self.step_seconds
            last = rows
        return seconds


def load_prices(path: Path) -> tuple[dict[int, float], float]:
    """The table and plain decoding's step (the median of the workloads' plain tok/s) of a
    `bench speculative --json` result."""
    result = json.loads(path.read_text())
    try:
        table = {int(rows): float(s) for rows, s in result["calibrated_cost_s"].items()}
        plain = [w["plain_tok_s"]["median"] for w in result["workloads"].values()]
    except (KeyError, TypeError, ValueError) as exc:
        raise SystemExit(f"{path}: not a bench speculative result ({exc})") from exc
    if 1 not in table or len(table) < 2 or not plain:
        raise SystemExit(f"{path}: its cost table needs one row and more ({sorted(table)})")
    return table, 1.0 / statistics.median(plain)


def priced_request(
    loaded: Any, config: EngineConfig, costs: PricedCosts, work: Workload, drafter: str, n: int
) -> tuple[int, float, tuple[tuple[int, ...], ...], dict[str, int]]:
    """Each conversation in a fresh session: its measured request's tokens (after the
    first, as `bench speculative` counts them), priced seconds, token ids and drafts."""
    tokens, seconds, ids, counts = 0, 0.0, (), {"drafted": 0, "accepted": 0, "verifies": 0}
    for steps in work.conversations:
        session = fresh_session(loaded, None, config, costs)
        own: PricedCosts = session.costs  # a copy: the session's own record
        # the measured request's forwards alone: the last one's
        done = converse(session, steps, work.follow_up, drafter, n, before_each=own.forget)
        tokens += max(0, done.stats.generated_tokens - 1)  # a forward each (the prefill
        seconds += own.price(own.forwards)  # gave the first)
        ids += (done.token_ids,)
        for key in counts:
            counts[key] += getattr(done.stats, key)
    return tokens, seconds, ids, counts


def run(args: argparse.Namespace, config: EngineConfig) -> dict[str, Any]:
    from engine.loader import load_model

    if config.auto_block:
        raise SystemExit(
            "BRANCHCHAT_AUTO_BLOCK=1 pools the block drafter, whose pass is not priced"
        )
    table, step = load_prices(Path(args.costs))
    path = common.model_file(args.model)
    loaded = load_model(path, config)
    costs = PricedCosts(table, step, queued=args.queue)
    workloads: dict[str, Any] = {}
    for name in args.workloads:
        rows = {mode: priced_request(loaded, config, costs, WORKLOADS[name], FREE_MODES[mode],
                                     args.max_tokens) for mode in args.modes}  # fmt: skip
        tokens, plain_s, plain_ids, _ = rows["plain"]
        out: dict[str, Any] = {"tokens": tokens, "plain_tok_s": tokens / plain_s}
        out["identical"] = all(r[2] == plain_ids for r in rows.values())
        for mode, (_, seconds, _, counts) in rows.items():
            if mode != "plain":
                out[mode] = {"tok_s": tokens / seconds, "speedup": plain_s / seconds, **counts}
        workloads[name] = out
    return common.rounded({
        "command": f"python -m bench priced --costs {args.costs} "
                   + (f"--model {args.model} " if args.model else "")
                   + f"--max-tokens {args.max_tokens} --modes {','.join(args.modes)} "
                   f"--workloads {','.join(args.workloads)}"
                   + (" --queue" if args.queue else ""),
        "date": common.now_iso(),
        "priced_by": {"file": str(args.costs), "table_s": table, "plain_step_s": step,
                      "queue": args.queue},
        "workloads": workloads,
        "machine": common.machine(),
        "versions": common.versions(),
        "model": {**common.model_info(path), "backend": loaded.ops.name},
    })  # fmt: skip


def print_table(result: dict[str, Any]) -> None:
    modes = [m for m in next(iter(result["workloads"].values())) if m in FREE_MODES]
    print(f"priced by {result['priced_by']['file']}")
    for name, w in result["workloads"].items():
        line = f"{name:<12} plain {w['plain_tok_s']:8.1f} tok/s"
        for mode in modes:
            m = w[mode]
            line += f"  {mode} {m['speedup']:.3f}x ({m['accepted']}/{m['drafted']}"
            line += f", {m['verifies']} verifies)"
        print(line + f"  identical {w['identical']}")


def main(argv: list[str] | None = None, config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench priced", description=__doc__)
    parser.add_argument("--costs", required=True, help="a bench speculative --json result")
    parser.add_argument("--model", help="a .gguf file or a shipped model's name")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per answer")
    parser.add_argument("--backend", choices=("numpy", "mlx"), default=None)
    parser.add_argument(
        "--modes", type=_names(FREE_MODES), default=["plain", "auto"], help="drafts free to draw"
    )
    parser.add_argument("--workloads", type=_names(WORKLOADS), default=["regenerate", "chat"])
    parser.add_argument(
        "--queue",
        action="store_true",
        help="plain steps queued as before session 46: a verify after one costs a discarded step",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.max_tokens < 2:
        parser.error("--max-tokens must be >= 2")
    if "plain" not in args.modes:
        args.modes = ["plain", *args.modes]
    result = run(args, common.engine_config(config, args.backend))
    return common.report("priced", result, args.json, print_table)
