"""How many tokens a second a block drafter would give under a verify-cost curve: for
fixed draft lengths, for a floor on the drafter's confidence, and for the engine's own
cut (decoding.cut_draft). The engine's runtime replayed on held-out chats (project venv),
costs as parameters.

    python -m tools.drafter.draft_policy [--limit 40] [--max-tokens 256] [--drafter FILE] \
        [--costs 1:1.20,8:2.31,16:3.36] [--pass-ms 0.3] [--record FILE.npz] [--load FILE.npz]

Each held-out chat is one real greedy request (engine_accuracy.py's `record`); at every
reply position the drafter's block (15 rows) is replayed through `block_logits` and kept
as two numbers a row: whether its top-1 is the target's next greedy token, and the
drafter's confidence (block_drafter.confidence: the running product of top-1
probabilities). A round drafts k rows and verifies k + 1 (the engine's CostModel holding
the curve, ms per verify of that many rows), plus `pass_ms` for the draft pass, and yields
the leading run of correct rows plus the target's own token. Policies: fixed k; rows while
the confidence stays >= tau; the engine's cut (at least one row).

The default costs are the H200's calibration in docs/BENCHMARKS.md ("The block drafter":
1.20 ms for 1 row, 2.31 for 8, 3.36 for 16, the fused one-launch step). A model, not a
measurement: `bench speculative` on the machine says what a policy really gives.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from engine import events as ev
from engine.block_drafter import confidence
from engine.config import EngineConfig
from engine.decoding import cut_draft
from engine.default_model import default_model_path
from engine.draft_costs import CostModel
from engine.drafter_file import BlockDrafterWeights, target_signature
from engine.drafter_pool import DrafterPool, Member
from engine.drafters import Draft
from engine.loader import load_model
from engine.session import Session
from tools.drafter.engine_accuracy import (
    RecordingDrafter,
    conversations,
    record,
    replay,
    row_hits,
)

ROWS = 15
TAUS = (0.9, 0.7, 0.5, 0.3, 0.2, 0.1, 0.05)


def row_stats(vocab: np.ndarray, seq: dict, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(correct [A, R] bool, the drafter's confidence [A, R]: block_drafter.confidence) at
    every reply anchor; a row past the reply's end counts as wrong (nothing to accept)."""
    correct, _ = row_hits(vocab, seq, logits)
    sure = np.array([confidence(np.asarray(block, np.float64)) for block in logits], np.float32)
    return correct, sure


def cost_model(text: str) -> CostModel:
    """The engine's cost model holding a verify-cost curve "rows:ms,..." (1 row first)."""
    points = sorted((int(r), float(ms) / 1000) for r, ms in (p.split(":") for p in text.split(",")))
    if len(points) < 2 or points[0][0] != 1:
        raise ValueError(f"--costs needs the 1-row cost and one more point: {text!r}")
    costs = CostModel()
    costs.step_seconds = points[0][1]
    costs.ratios = {rows: seconds / points[0][1] for rows, seconds in points}
    return costs


def leading_run(correct: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Accepted drafts per anchor: the run of correct rows from row 1, at most k."""
    return np.minimum(np.cumprod(correct, axis=1).sum(axis=1), k)


def policy(correct: np.ndarray, k: np.ndarray, costs: CostModel, pass_s: float) -> dict:
    """Speedup over plain steps with every anchor taken as a round's start (an average
    over positions, not one walk); every round pays the draft pass."""
    tokens = leading_run(correct, k) + 1
    seconds = np.array([costs.cost(int(rows)) for rows in k + 1]) + pass_s
    return {
        "speedup": round(float(tokens.sum() / seconds.sum() * costs.cost(1)), 3),
        "mean_rows": round(float(k.mean()), 2),
        "accepted_per_round": round(float(tokens.mean() - 1), 3),
    }


def evaluate(correct: np.ndarray, sure: np.ndarray, costs: CostModel, pass_s: float) -> dict:
    n = len(correct)
    fixed = {k: policy(correct, np.full(n, k), costs, pass_s) for k in range(1, ROWS + 1)}
    best_k = max(fixed, key=lambda k: fixed[k]["speedup"])
    tau = {t: policy(correct, (sure >= t).sum(axis=1), costs, pass_s) for t in TAUS}
    dummy = list(range(ROWS))
    cut = np.array(
        [len(cut_draft(Draft(dummy, list(map(float, row))), costs).tokens) for row in sure]
    )
    return {
        "anchors": n,
        "top1_by_row": [round(float(a), 4) for a in correct.mean(axis=0)],
        "mean_leading_run": round(float(leading_run(correct, np.full(n, ROWS)).mean()), 3),
        "calibration_row1": calibration(correct[:, 0], sure[:, 0]),
        "fixed_k": {k: v["speedup"] for k, v in fixed.items()},
        "best_fixed_k": {"k": best_k, **fixed[best_k]},
        "confidence_floor": tau,
        "engine_cut": policy(correct, cut, costs, pass_s),
    }


def calibration(correct: np.ndarray, sure: np.ndarray) -> list[dict]:
    """Row 1's confidence against how often it was right, by confidence band."""
    edges = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.01)
    out = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        inside = (sure >= lo) & (sure < hi)
        if inside.any():
            out.append({"band": [lo, min(hi, 1.0)], "n": int(inside.sum()),
                        "confidence": round(float(sure[inside].mean()), 3),
                        "observed": round(float(correct[inside].mean()), 3)})  # fmt: skip
    return out


def recording_sessions(
    limit: int, backend: str | None = None, drafter: Path | None = None
) -> Iterator[tuple[BlockDrafterWeights, Any, Session, list[dict[str, str]]]]:
    """(the drafter's weights, the target, a fresh session whose block drafter records the
    rows it is handed, the held-out conversation) for each of `limit` conversations."""
    config = EngineConfig(backend=backend)
    loaded = load_model(default_model_path(), config)
    first = Session(loaded, config=config)
    if first.block_drafter is None and drafter is None:
        raise SystemExit(first.block_problem)
    path = drafter or first.block_drafter.w.path  # type: ignore[union-attr]
    weights = BlockDrafterWeights(
        path, loaded.model, target_signature(loaded.config, loaded.tokenizer)
    )
    for messages in conversations(limit):
        session = Session(loaded, config=config)
        session.block_drafter = RecordingDrafter(weights, loaded.model)
        own = Member("block", session.block_drafter, session.acceptance[ev.DrafterKind.BLOCK])
        session.block_pool = DrafterPool([own])
        yield weights, loaded.model, session, messages


def collect_rows(
    limit: int,
    max_tokens: int,
    stats: Callable[[np.ndarray, dict, np.ndarray], tuple[np.ndarray, np.ndarray]],
    backend: str | None = None,
    drafter: Path | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`stats(vocab, seq, block logits)`'s two arrays for each held-out request's reply
    anchors, concatenated over the conversations."""
    firsts, seconds = [], []
    for n, (weights, target, session, messages) in enumerate(
        recording_sessions(limit, backend, drafter)
    ):
        seq = record(session, messages, max_tokens)
        a, b = stats(weights.vocab, seq, replay(weights, target, seq, ROWS))
        firsts.append(a)
        seconds.append(b)
        print(f"{n + 1:2d}: {len(a)} anchors", flush=True)
    return np.concatenate(firsts), np.concatenate(seconds)


def add_replay_args(p: argparse.ArgumentParser) -> None:
    """The held-out replay's arguments, and its record to keep or load instead."""
    p.add_argument("--limit", type=int, default=40, help="held-out conversations")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--record", type=Path, default=None, help="keep the replay's rows here")
    p.add_argument("--load", type=Path, default=None, help="the rows of an earlier --record")


def replayed_rows(
    args: argparse.Namespace,
    stats: Callable[[np.ndarray, dict, np.ndarray], tuple[np.ndarray, np.ndarray]],
    names: tuple[str, str],
) -> tuple[np.ndarray, np.ndarray]:
    """`collect_rows` under `add_replay_args`' arguments, kept in (or loaded from) an npz
    under `names`."""
    if args.load is not None:
        saved = np.load(args.load)
        return saved[names[0]], saved[names[1]]
    backend, drafter = getattr(args, "backend", None), getattr(args, "drafter", None)
    first, second = collect_rows(args.limit, args.max_tokens, stats, backend, drafter)
    if args.record is not None:
        np.savez_compressed(args.record, **{names[0]: first, names[1]: second})
    return first, second


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_replay_args(p)
    p.add_argument("--drafter", type=Path, default=None, help="default: the shipped file")
    p.add_argument("--backend", default=None, help="numpy or mlx (default: the engine's)")
    p.add_argument("--costs", default="1:1.20,8:2.31,16:3.36", help="rows:ms,... of a verify")
    p.add_argument("--pass-ms", type=float, default=0.3, help="one draft pass, ms")
    args = p.parse_args(argv)
    correct, sure = replayed_rows(args, row_stats, ("correct", "confidence"))
    result = evaluate(correct, sure, cost_model(args.costs), args.pass_ms / 1000)
    print(json.dumps({"costs_ms": args.costs, "pass_ms": args.pass_ms, **result}))


if __name__ == "__main__":
    main()
