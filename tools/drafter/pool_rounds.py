"""Which member of the block pool drafts each round, and how its drafts fare, split by
whether prompt lookup had a match that round (project venv):

    python -m tools.drafter.pool_rounds [--workload open_chat] [--runs 1] [--rank-only]

Runs `bench speculative`'s workload with the "block" choice (the block drafter pooled
with prompt lookup, engine/drafter_pool.py). Every round the pool proposes, lookup is
also asked, on the side, what it would draft (its proposal reads the index and changes
nothing). Prints one line per (member that drafted, lookup had a match): rounds, tokens
drafted (before the confidence cut) and accepted. `--rank-only` turns off the rule that a
free member with a match goes first, so the members are taken in the ranking's order:
what the rule was decided on.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench import common
from bench import speculative as bench
from engine.config import EngineConfig
from engine.drafter_pool import DrafterPool, Member, PoolAcceptance
from engine.drafters import Draft
from engine.loader import load_model
from engine.session import Session


class Tally:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, bool], list[int]] = defaultdict(lambda: [0, 0, 0])
        self.key: tuple[str, bool] | None = None

    @contextmanager
    def installed(self, rank_only: bool) -> Iterator[None]:
        """The pool's propose and its acceptance's observe wrapped to count each round
        (and, with `rank_only`, no member counted free), put back on the way out."""
        propose, observe, free = DrafterPool.propose, PoolAcceptance.observe, Member.free

        def counted_propose(pool: DrafterPool, pending: int, k: int) -> Draft:
            lookup = next(m for m in pool.members if m.name == "lookup")
            had_match = bool(lookup.drafter.propose(pending, max(k, 1)).tokens)
            draft = propose(pool, pending, k)
            self.key = (pool.last.name, had_match) if pool.last is not None else None
            return draft

        def counted_observe(acc: PoolAcceptance, drafted: int, accepted: int) -> None:
            if self.key is not None:
                row = self.rows[self.key]
                row[0], row[1], row[2] = row[0] + 1, row[1] + drafted, row[2] + accepted
                self.key = None
            observe(acc, drafted, accepted)

        DrafterPool.propose = counted_propose  # type: ignore[method-assign]
        PoolAcceptance.observe = counted_observe  # type: ignore[method-assign]
        if rank_only:
            Member.free = property(lambda _m: False)  # type: ignore[assignment, method-assign]
        try:
            yield
        finally:
            DrafterPool.propose = propose  # type: ignore[method-assign]
            PoolAcceptance.observe = observe  # type: ignore[method-assign]
            Member.free = free  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="open_chat", choices=sorted(bench.WORKLOADS))
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rank-only", action="store_true", help="no free-member-first rule")
    args = p.parse_args(argv)
    tally = Tally()
    config = EngineConfig()
    loaded = load_model(common.default_model(), config)
    calibration = Session(loaded, config=config)
    calibration.calibrate()
    work = bench.WORKLOADS[args.workload]
    tok_s = []
    with tally.installed(args.rank_only):
        for _ in range(args.runs):
            costs = calibration.costs
            sample = bench.measure(loaded, config, costs, work, "block", args.max_tokens)
            tok_s.append(round(sample.tok_s, 1))
    rows = [
        {"member": member, "lookup_had_match": match, "rounds": r, "drafted": d, "accepted": a}
        for (member, match), (r, d, a) in sorted(tally.rows.items())
    ]
    result = {"workload": args.workload, "rank_only": args.rank_only, "tok_s": tok_s, "rows": rows}
    for row in rows:
        share = row["accepted"] / row["drafted"] if row["drafted"] else 0.0
        print(
            f"{row['member']:<7} lookup match {row['lookup_had_match']!s:<5} "
            f"rounds {row['rounds']:5d}  accepted {row['accepted']:5d} / {row['drafted']:5d} "
            f"({share:.0%})"
        )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
