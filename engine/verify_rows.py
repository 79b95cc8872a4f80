"""A forward's logits on the host in the form its tokens are read from, and the tokens.

Greedy rows come as their argmax alone (`OneHot`: a GPU sends a few ints, not the
vocabulary). A nucleus draw on MLX takes each row's pack of its likeliest tokens and
leaves the rows on the device (`device_sampling.PackedRows`), a row copied only where its
pack cannot tell (engine/sampling_candidates.py). Otherwise the rows themselves. Each row's
token is the one plain decoding draws there (`token`), whatever form it came in: a
verify's accepted count (`verify`) is coupled sampling's (engine/decoding.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine import sampling, sampling_candidates
from engine.device_sampling import PackedRows
from engine.drafters import Draft
from engine.runner.ahead import Launch
from engine.sampling import PositionalUniforms, SamplingSettings
from kernels.ops import Array, Ops


class OneHot:
    """Greedy rows as their argmax alone: all greedy sampling reads of them (`token`)."""

    def __init__(self, top: np.ndarray) -> None:
        self.top = top


class Headed:
    """A verify's rows behind the queued step that computed its first row (the draft's
    pending token, engine/decoding.py): row 0 is read from that step, the rest from `rows`."""

    def __init__(self, head: Launch, rows: Any) -> None:
        self.head, self.rows = head, rows


def to_host(ops: Ops, logits: Array, s: SamplingSettings) -> Any:
    """Logits rows [n, V] in the form `token` reads for settings `s`."""
    if s.is_greedy and s.repetition_penalty == 1.0:
        return OneHot(ops.argmax_rows(logits))
    if ops.name == "mlx" and sampling_candidates.can_decide(s):
        return PackedRows(logits, s.temperature)
    return ops.to_numpy(logits)


def token(
    rows: Any,
    i: int,
    history: list[int],
    end: int,
    s: SamplingSettings,
    uniforms: PositionalUniforms,
) -> int:
    """Row i's token, sampled as plain decoding samples it after history[:end]; of greedy
    one-hot rows, the argmax as read (no row built, no history copied)."""
    if isinstance(rows, Headed):
        if i == 0:  # the queued step's token, read as `_plain_run` reads it
            guess = rows.head.read()
            return guess if s.is_greedy else host_draw(rows.head, history[:end], s, uniforms)
        rows, i = rows.rows, i - 1
    if isinstance(rows, OneHot):
        return int(rows.top[i])
    if isinstance(rows, PackedRows):
        return _from_pack(rows.packs[i], lambda: rows.row(i), history[:end], s, uniforms)
    return sampling.sample(rows[i], history[:end], s, uniforms)


def verify(
    logits: Any,
    draft: Draft,
    k: int,
    history: list[int],
    s: SamplingSettings,
    uniforms: PositionalUniforms,
) -> tuple[int, int]:
    """Accepted count among the k drafted tokens and the target's own next token: row i's
    token is sampled as plain decoding samples it there; a draft stands iff it equals it.

    `history` already holds the verified rows; row i's history is its prefix.
    """
    base = len(history) - k  # rows are [pending, d1..dk]; row i's history is history[:base+i]
    for i in range(k):
        target = token(logits, i, history, base + i, s, uniforms)
        if draft.tokens[i] != target:
            return i, target
    return k, token(logits, k, history, base + k, s, uniforms)


def host_draw(
    step: Launch, history: list[int], s: SamplingSettings, uniforms: PositionalUniforms
) -> int:
    """`sampling.sample`'s token from a queued step (after `history`)."""
    return _from_pack(step.read_pack(), step.read_row, history, s, uniforms)


def _from_pack(
    packed: np.ndarray | None,
    row: Callable[[], np.ndarray],
    history: list[int],
    s: SamplingSettings,
    uniforms: PositionalUniforms,
) -> int:
    """`sampling.sample`'s token: from the device's pack of the likeliest tokens where it
    tells (engine/sampling_candidates.py), else from the whole row, read only then."""
    drawn = None
    if packed is not None:
        drawn = sampling_candidates.decide(packed, s, uniforms.uniform(len(history)))
    return sampling.sample(row(), history, s, uniforms) if drawn is None else drawn
