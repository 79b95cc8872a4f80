"""The block drafter's pass timed for `python -m bench speculative` (its `block_pass_ms`
figures): the engine's pass at each draft length, beside the op-by-op pass (greedy) or
the draws from rows as wide as the target's vocabulary (sampled)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from engine.sampling import CoupledSampler, PositionalUniforms, SamplingSettings, sample


def pass_times(drafter: Any, sampling: SamplingSettings) -> dict[str, dict[str, float]]:
    """`block_pass_ms`: the engine's pass, greedy or drawing with `sampling` as a sampled
    request couples it. Beside it, two timed in turn twice (the faster of each pair):
    greedy where the pass is one call (traced on an MLX GPU, C on NumPy), the same
    weights' pass op by op (`block_pass_ms_op_by_op`); sampled, the draws from rows as
    wide as the target's vocabulary (`block_pass_ms_full_row_draws`)."""
    from engine.block_drafter import BlockDrafter

    if not sampling.is_greedy:
        uniforms = PositionalUniforms(sampling.seed)

        def full_row(row: np.ndarray, history: list[int]) -> int:  # no `among`
            return sample(row, history, sampling, uniforms)

        coupled = CoupledSampler(sampling, uniforms)
        return _in_turn(
            lambda: time_block_pass(drafter, sampler=coupled),
            lambda: time_block_pass(drafter, sampler=full_row),
            "block_pass_ms_full_row_draws",
        )
    if drafter.compiled is None and drafter.cpu_pass is None:
        return {"block_pass_ms": time_block_pass(drafter)}
    op_by_op = BlockDrafter(drafter.w, drafter.target)
    return _in_turn(
        lambda: time_block_pass(drafter),
        lambda: time_block_pass(op_by_op),
        "block_pass_ms_op_by_op",
    )


def _in_turn(engines: Any, other: Any, name: str) -> dict[str, dict[str, float]]:
    runs = [(engines(), other()) for _ in range(2)]
    fast, slow = ({k: min(r[i][k] for r in runs) for k in runs[0][i]} for i in (0, 1))
    return {"block_pass_ms": fast, name: slow}


def time_block_pass(
    drafter: Any,
    ks: tuple[int, ...] = (1, 4, 8, 15),
    context: int = 300,
    repeats: int = 10,
    sampler: Any = None,
) -> dict[str, float]:
    """Milliseconds of one draft pass (`propose`, its logits read back and the projection
    of the row committed before it included) at each k, from `context` rows of
    target-shaped noise on (a pass's cost does not depend on the values), one more row each
    pass as a request's rounds see: a cost paid per new shape (a GPU library building a
    graph for each key count) shows. The median of `repeats` after one warm-up; with
    `sampler` coupled, sampled drafts. The drafter is left reset."""
    rng = np.random.default_rng(0)
    width, vocab = drafter.target.config.hidden_size, drafter.target.config.vocab_size
    tokens = [int(t) for t in rng.integers(0, vocab, context)]
    drafter.begin(tokens)
    drafter.observe_hidden(rng.standard_normal((context, width)).astype(np.float32), 0)
    drafter.couple(sampler)  # after `begin`, which uncouples
    out: dict[str, float] = {}
    for k in ks:
        if k > drafter.max_draft:
            continue
        drafter.propose(tokens[-1], k)
        seconds = []
        for _ in range(repeats):
            drafter.observe_hidden(rng.standard_normal((1, width)).astype(np.float32))
            drafter.commit([int(rng.integers(0, vocab))])
            t0 = time.perf_counter()
            drafter.propose(drafter.tokens[-1], k)
            seconds.append(time.perf_counter() - t0)
        out[str(k)] = 1e3 * statistics.median(seconds)
    drafter.begin([])
    return out
