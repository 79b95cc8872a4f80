"""What a tree of drafts would add over the engine's chain, for the shipped block drafter
under a verify-cost curve (project venv). A model, not a measurement: it says whether
verifying several candidates a row (SpecInfer, Miao et al. 2024; EAGLE-2's dynamic tree,
Li et al. 2024) is worth building before the verify kernels take a tree mask.

    python -m tools.drafter.tree_policy [--limit 40] [--max-tokens 256] \
        [--costs 1:1.30,2:1.49,4:1.79,8:2.19,16:3.58] [--pass-ms 0,0.5] \
        [--record FILE.npz] [--load FILE.npz]

The held-out chats are replayed as tools/drafter/draft_policy.py replays them. At each
reply anchor the drafter's rows are one pass over mask tokens, so row j's distribution
does not depend on the token taken at row j - 1: a tree's node is a tuple of ranks
(r_1..r_d), its score the product of those rows' probabilities. A tree of N nodes takes
the N best tuples (best-first; a prefix scores at least its extensions, so the tree is
closed under prefixes), verifies N + 1 rows, and yields the deepest node on the target's
greedy path plus the target's own token. The chain of k is the tree whose tuples are
all rank 0.
"""

from __future__ import annotations

import argparse
import heapq
import json

import numpy as np

from tools.drafter.draft_policy import add_replay_args, cost_model, replayed_rows

ROWS, TOP = 15, 8
NOT_IN_TOP = 99


def row_ranks(vocab: np.ndarray, seq: dict, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rank of the target's token among each row's TOP best, NOT_IN_TOP if not there or
    past the reply [A, R]; the TOP best probabilities [A, R, TOP])."""
    tokens, start = np.asarray(seq["tokens"]), seq["reply_start"]
    at = np.arange(start, len(tokens) - 1)[:, None] + np.arange(1, logits.shape[1] + 1)[None, :]
    present = at < len(tokens)
    truth = tokens[np.minimum(at, len(tokens) - 1)]
    where = {int(t): i for i, t in enumerate(vocab)}
    index = np.vectorize(lambda t: where.get(int(t), -1))(truth)
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    order = np.argsort(-p, axis=-1)[..., :TOP]  # [A, R, TOP]
    hit = order == index[..., None]
    ranks = np.where(hit.any(-1) & present, hit.argmax(-1), NOT_IN_TOP)
    return ranks.astype(np.int16), np.take_along_axis(p, order, -1).astype(np.float32)


def best_tree(probs: np.ndarray, nodes: int) -> set[tuple[int, ...]]:
    """The `nodes` rank tuples of highest product probability. probs: [R, TOP]."""
    tree: set[tuple[int, ...]] = set()
    frontier = [(-float(probs[0, r]), (r,)) for r in range(TOP)]
    heapq.heapify(frontier)
    while frontier and len(tree) < nodes:
        score, node = heapq.heappop(frontier)
        tree.add(node)
        if len(node) < len(probs):
            for r in range(TOP):
                heapq.heappush(frontier, (score * float(probs[len(node), r]), (*node, r)))
    return tree


def accepted(tree: set[tuple[int, ...]], ranks: np.ndarray) -> int:
    """Drafts accepted: the depth of the deepest tree node on the target's path."""
    depth = 0
    while depth < len(ranks) and tuple(int(r) for r in ranks[: depth + 1]) in tree:
        depth += 1
    return depth


def evaluate(ranks: np.ndarray, probs: np.ndarray, costs_text: str, pass_ms: float) -> dict:
    costs = cost_model(costs_text)
    pass_s = pass_ms / 1000

    def speedup(accepts: np.ndarray, verified_rows: int) -> dict:
        seconds = costs.cost(verified_rows) + pass_s
        rate = (1 + accepts.mean()) / seconds * costs.cost(1)
        return {"accepted_per_round": round(float(accepts.mean()), 3), "speedup": round(rate, 3)}

    run = np.cumprod(ranks == 0, axis=1).sum(axis=1)
    chain = {k: speedup(np.minimum(run, k), k + 1) for k in (1, 2, 3, 4, 7)}
    pairs = list(zip(ranks, probs, strict=True))
    tree = {
        n: speedup(np.array([accepted(best_tree(p, n), r) for r, p in pairs]), n + 1)
        for n in (2, 3, 4, 6, 8, 12, 15)
    }
    return {
        "pass_ms": pass_ms,
        "chain": chain,
        "tree": tree,
        "best_chain": max(v["speedup"] for v in chain.values()),
        "best_tree": max(v["speedup"] for v in tree.values()),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_replay_args(p)
    p.add_argument("--costs", default="1:1.30,2:1.49,4:1.79,8:2.19,16:3.58")
    p.add_argument("--pass-ms", default="0,0.5", help="draft pass costs to model, ms")
    args = p.parse_args(argv)
    ranks, probs = replayed_rows(args, row_ranks, ("ranks", "probs"))
    for pass_ms in (float(x) for x in args.pass_ms.split(",")):
        print(json.dumps({"costs_ms": args.costs, **evaluate(ranks, probs, args.costs, pass_ms)}))


if __name__ == "__main__":
    main()
