"""Auto's host work each decode step: what prompt lookup and the drafter pool add to a
plain step on the host, without any model forward.

Whatever Auto asks each step (the pool's choice of k, lookup's index extended by the token,
its proposal, the cut) is host work on every plain step of a fresh question, where lookup
seldom drafts: on a CPU it adds to the step, on a GPU it overlaps the queued step's kernel
and shows where the host's part is the longer (the H100's queued step of the default model
~0.72-0.79 ms, session 46). This bench runs that bookkeeping as
engine/decoding.py's `_plain_run` does, step by step over `--tokens` tokens of prose
(tokenized by the default model's tokenizer), with the cost table of a GPU round (`--costs`:
a `bench speculative --json` result's `calibrated_cost_s`), and reports microseconds a step
(median of `--runs`) and how many tokens lookup kept after its cut.

    python -m bench auto_host [--costs docs/h100/spec-ab-new-r1-20261208-s46.json]
        [--tokens 2000] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench import common
from engine import decoding
from engine.config import EngineConfig
from engine.draft_costs import CostModel, cut_draft
from engine.drafter_pool import DrafterPool, Member
from engine.loader import load_model
from engine.suffix_drafter import SuffixDrafter

DEFAULT_COSTS = Path("docs/h100/spec-ab-new-r1-20261208-s46.json")


def gpu_costs(path: Path) -> CostModel:
    """A cost model fixed to a GPU round's calibrated table."""
    table = {int(rows): s for rows, s in json.loads(path.read_text())["calibrated_cost_s"].items()}
    costs = CostModel()
    costs.step_seconds, costs.ratios = table[1], {m: s / table[1] for m, s in table.items()}
    return costs


def bookkeeping(ids: list[int], prompt: int, costs: CostModel) -> tuple[float, int]:
    """(seconds a step, tokens kept) for Auto's lookup pool over ids[prompt:], as queued
    plain steps run it: the acceptance ages, the pool picks k, the step's token is
    committed, and lookup proposes on the next one, cut as a draft on a queued step is."""
    pool = DrafterPool([Member("lookup", SuffixDrafter())])
    req = SimpleNamespace(drafter=pool, acceptance=pool.acceptance, max_tokens=1 << 30)
    req.context_limit = 1 << 30
    state = SimpleNamespace(offset=prompt, max_verify_rows=lambda: 1 << 30)
    pool.begin(ids[:prompt])
    pool.acceptance.forget()
    kept, pending = 0, ids[prompt]
    t0 = time.perf_counter()
    for i in range(prompt + 1, len(ids)):
        pool.acceptance.idle()
        k = decoding._choose_k(req, costs, i - prompt, state, 1 << 30)  # type: ignore[arg-type]
        pool.commit([pending])
        if k:
            kept += len(cut_draft(pool.propose(ids[i], k), costs, queued=True).tokens)
        state.offset += 1
        pending = ids[i]
    pool.end()
    return (time.perf_counter() - t0) / (len(ids) - prompt - 1), kept


def run(args: argparse.Namespace, config: EngineConfig) -> dict[str, Any]:
    tokenizer = load_model(common.default_model(), config).tokenizer
    ids = common.prompt_ids(tokenizer, args.tokens + 64, seed=args.seed)
    costs = gpu_costs(args.costs)
    samples = [bookkeeping(ids, 64, costs) for _ in range(args.runs + 1)][1:]  # one to warm
    return {
        "command": "python -m bench auto_host " + " ".join(args.argv),
        "date": common.now_iso(),
        "costs": str(args.costs),
        "tokens": args.tokens,
        "step_us": common.spread([s * 1e6 for s, _ in samples]),
        "kept_tokens": samples[0][1],
        "machine": common.machine(),
        "versions": common.versions(),
    }


def print_table(result: dict[str, Any]) -> None:
    us = result["step_us"]
    print(
        f"Auto's host work a step: {us['median']:.1f} us (min {us['min']:.1f}, max "
        f"{us['max']:.1f}) over {result['tokens']} tokens; lookup kept {result['kept_tokens']}"
    )


def main(argv: list[str] | None = None, config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench auto_host", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--costs", type=Path, default=DEFAULT_COSTS, help="a GPU round's JSON")
    parser.add_argument("--tokens", type=int, default=2000, help="steps to run")
    parser.add_argument("--runs", type=int, default=5, help="runs to take the median of")
    parser.add_argument("--seed", type=int, default=0, help="the prose's")
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    result = run(args, common.engine_config(config, "numpy"))
    return common.report("auto_host", result, args.json, print_table)
