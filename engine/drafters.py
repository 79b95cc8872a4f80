"""Drafters for speculative decoding: cheap proposals that the target model verifies.

A drafter never changes the output (verification does); it only proposes. The decode
loop keeps a *pending* token (sampled, not yet forwarded) and each step calls
`propose(pending, k)`, verifies the draft in one batched target pass, then
`commit(tokens)` with what it kept (the pending token first). See docs/DESIGN.md,
"Speculative decoding contracts".

- `SuffixDrafter` (engine/suffix_drafter.py): prompt lookup over the whole conversation
  history, every request and every branch, via a suffix automaton.
- `DraftModelDrafter`: a small model sharing the target's tokenizer.

Trained block drafters (DFlash-style, conditioned on the target's hidden states) and a
model's own MTP head plug into the same Protocol with one extension: the drafter sets
`wants_hidden = True` and defines `observe_hidden(rows)`. After each verify the decode
loop then passes the target's hidden-state rows for the committed tokens (one row per
token of the following `commit`, in order), before that `commit`. `propose` drafts a
block from the last observed rows plus the pending token's embedding; `begin` gets the
prompt's rows through `observe_hidden` after the target's prefill. Nothing here
implements one: the decode loop only needs to check `getattr(d, "wants_hidden", False)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.errors import StateError
from engine.models.protocol import Model
from engine.sequence import prefill, truncate
from engine.state import Checkpoint


@dataclass(frozen=True)
class Draft:
    """A deterministic proposal: the same context always gives the same tokens, which is
    what lets the decode loop's coupled sampling reproduce plain seeded decoding."""

    tokens: list[int]  # proposed continuation (may be shorter than asked, or empty)


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

    Between requests its state holds exactly the committed context: `propose`
    checkpoints, drafts, and rolls back; `commit` only queues the committed tokens, which
    the next `propose` (or `end`) forwards in one batched call, so plain steps between
    drafts cost the draft model nothing until it drafts again. It drafts greedily, whatever
    the request's temperature: a deterministic draft is what coupled sampling needs (the
    target still samples every token; a draft only decides how many are verified at once).
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        self.state = model.new_state()
        self._queued: list[int] = []  # committed, not yet forwarded

    def begin(self, context: list[int]) -> None:
        self._queued = []
        tokens = self.state.tokens
        lcp = 0
        for a, b in zip(tokens, context, strict=False):
            if a != b:
                break
            lcp += 1
        if lcp < len(tokens):
            truncate(self.model, self.state, lcp)
        if lcp < len(context):
            prefill(self.model, self.state, context[lcp:])

    def propose(self, pending: int, k: int) -> Draft:
        if k <= 0:
            return Draft([])
        self.sync()
        state, model = self.state, self.model
        cp = state.checkpoint()
        drafted: list[int] = []
        try:
            logits = model.forward([pending], state, logits="last")
            for i in range(k):
                token = int(model.ops.argmax_rows(logits)[-1])
                drafted.append(token)
                if i + 1 < k:
                    logits = model.forward([token], state, logits="last")
        finally:
            self._restore(cp)
        return Draft(drafted)

    def commit(self, tokens: list[int]) -> None:
        self._queued.extend(tokens)

    def end(self) -> None:
        self.sync()  # keep the state: the next request usually shares a long prefix

    def sync(self) -> None:
        """Forward the queued committed tokens now."""
        if self._queued:
            prefill(self.model, self.state, self._queued)
            self._queued = []

    def _restore(self, cp: Checkpoint) -> None:
        try:
            self.state.rollback(cp)
        except StateError:  # e.g. a sliding window's slack is shorter than the draft
            truncate(self.model, self.state, cp.position)
