"""Drafters for speculative decoding: cheap proposals that the target model verifies.

A drafter never changes the output (verification does); it only proposes. The decode
loop keeps a *pending* token (sampled, not yet forwarded) and each step calls
`propose(pending, k)`, verifies the draft in one batched target pass, then
`commit(tokens)` with what it kept (the pending token first). See docs/DESIGN.md,
"Speculative decoding contracts".

- `SuffixDrafter` (engine/suffix_drafter.py): prompt lookup over the whole conversation
  history, every request and every branch, via a suffix automaton.
- `DraftModelDrafter`: a small model sharing the target's tokenizer.

A drafter may define `couple(sample)`: the decode loop then hands it, at `begin`, the
request's own sampler (a logits row and its history -> the token plain decoding draws
there, from the request's per-position uniforms), so a drafting model draws its tokens
from the very uniforms the target will: where q is close to p, the two draws agree and
the draft stands far more often than a greedy draft would at temperature > 0. The draft
stays a function of the context, so the output is still exactly plain decoding's.

Trained block drafters (DFlash-style, conditioned on the target's hidden states) and a
model's own MTP head plug into the same Protocol with one extension: the drafter sets
`wants_hidden = True` and defines `observe_hidden(rows)`. After each verify the decode
loop then passes the target's hidden-state rows for the committed tokens (one row per
token of the following `commit`, in order), before that `commit`. `propose` drafts a
block from the last observed rows plus the pending token's embedding; `begin` gets the
prompt's rows through `observe_hidden(rows, start)` after the target's prefill.
`engine/block_drafter.py` implements one; the decode loop only checks
`getattr(d, "wants_hidden", False)`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from engine.errors import StateError
from engine.models.protocol import Model
from engine.sequence import prefill, truncate
from engine.state import Checkpoint

Sampler = Callable[[np.ndarray, list[int]], int]  # logits row, its history -> the token


@dataclass(frozen=True)
class Draft:
    """A deterministic proposal: the same context always gives the same tokens, which is
    what lets the decode loop's coupled sampling reproduce plain seeded decoding."""

    tokens: list[int]  # proposed continuation (may be shorter than asked, or empty)
    # the drafter's own estimate, per token, that the draft up to and including it is
    # accepted (a running product; empty: none): the decode loop cuts the draft where
    # expected tokens per second peak (draft_costs.cut_draft). The verify gives the same
    # output at any length, so a cut moves speed alone.
    confidence: list[float] = field(default_factory=list)
    # seconds of the proposal spent on work that is not this round's drafting (a draft
    # model forwarding a request's prompt at its first draft): not charged to the draft
    setup_seconds: float = 0.0
    # proposed without any model's forward (prompt lookup's): the decode loop may cut it
    # to no token at all, where even one drafted token does not pay (no pass was spent)
    free: bool = False


class Drafter(Protocol):
    def begin(self, context: list[int]) -> None:
        """A new request: `context` is every token the target state holds, none pending."""

    def propose(self, pending: int, k: int) -> Draft:
        """Up to k tokens that follow context + [pending]."""

    def commit(self, tokens: list[int]) -> None:
        """`tokens` (the pending one first) joined the context."""

    def end(self) -> None:
        """The request is over (learned data is kept)."""


# -- a small draft model ------------------------------------------------------------


class DraftModelDrafter:
    """A small model sharing the target's tokenizer, drafting one token per forward.

    Its state holds a prefix of the committed context and a queue holds the rest:
    `begin` and `commit` only queue tokens, which the next `propose` forwards in one
    batched call before it checkpoints, drafts and rolls back. So a draft model that is
    not asked to draft (a pool's member that does not pay, or k = 0) costs nothing, not
    even the prompt: that is forwarded at the request's first draft, and reported as the
    draft's `setup_seconds`, since it is the request's cost, not the draft's. Each draft
    is a function of the context (what coupled sampling needs): greedy on its own, and
    under `couple` drawn with the request's sampler from the draft model's logits.
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        self.state = model.new_state()
        self._sample: Sampler | None = None  # the request's, while one is coupled
        self._queued: list[int] = []  # the context after the state's, not yet forwarded
        self._prompt = 0  # of those, how many `begin` queued (the prompt's)

    def couple(self, sample: Sampler | None) -> None:
        """Draw drafts with the request's sampler (None: greedy) until the request ends."""
        self._sample = sample

    def begin(self, context: list[int]) -> None:
        self._sample = None  # a request couples after `begin`, if it samples
        held = len(self.state.tokens)
        lcp = 0
        for a, b in zip([*self.state.tokens, *self._queued], context, strict=False):
            if a != b:
                break
            lcp += 1
        if lcp < held:
            truncate(self.model, self.state, lcp)
        self._queued = list(context[len(self.state.tokens) :])
        self._prompt = len(self._queued)

    def propose(self, pending: int, k: int) -> Draft:
        if k <= 0:
            return Draft([])
        setup = 0.0
        if self._prompt:
            t0 = time.perf_counter()
            self.sync(self._prompt)
            setup = time.perf_counter() - t0
        self.sync()
        state, model = self.state, self.model
        cp = state.checkpoint()
        drafted: list[int] = []
        try:
            logits = model.forward([pending], state, logits="last")
            for i in range(k):
                if self._sample is None:
                    token = int(model.ops.argmax_rows(logits)[-1])
                else:  # the state holds context + [pending] + drafted: this row's history
                    row = np.asarray(model.ops.to_numpy(logits), dtype=np.float64)[-1]
                    token = self._sample(row, state.tokens)
                drafted.append(token)
                if i + 1 < k:
                    logits = model.forward([token], state, logits="last")
        finally:
            self._restore(cp)
        return Draft(drafted, setup_seconds=setup)

    def commit(self, tokens: list[int]) -> None:
        self._queued.extend(tokens)

    def end(self) -> None:
        """The queue stays: the next request's `begin` keeps what it shares of it."""
        self._sample = None

    def sync(self, count: int | None = None) -> None:
        """Forward the first `count` queued tokens (None: all) now."""
        n = len(self._queued) if count is None else min(count, len(self._queued))
        if n:
            prefill(self.model, self.state, self._queued[:n])
            self._queued = self._queued[n:]
            self._prompt = max(0, self._prompt - n)

    def _restore(self, cp: Checkpoint) -> None:
        try:
            self.state.rollback(cp)
        except StateError:  # e.g. a sliding window's slack is shorter than the draft
            truncate(self.model, self.state, cp.position)
