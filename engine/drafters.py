"""Drafters for speculative decoding: cheap proposals that the target model verifies.

A drafter never changes the output (verification does); it only proposes. The decode
loop keeps a *pending* token (sampled, not yet forwarded) and each step calls
`propose(pending, k)`, verifies the draft in one batched target pass, then
`commit(tokens)` with what it kept (the pending token first). See docs/DESIGN.md,
"Speculative decoding contracts".

- `SuffixDrafter`: prompt lookup over the whole conversation history, every request
  and every branch, via a suffix automaton (Blumer et al. 1985; the online
  construction as in Crochemore & Hancart, "Automata for matching patterns").
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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.errors import StateError
from engine.models.protocol import Model
from engine.sampling import draw
from engine.sequence import prefill, truncate
from engine.state import Checkpoint

Transform = Callable[[np.ndarray, list[int]], np.ndarray]  # logits row, history -> probs


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # proposed continuation (may be shorter than asked, or empty)
    # [len(tokens), vocab] float64 drafter distribution q per proposed token, or None for a
    # deterministic drafter (q is one-hot on the proposed token).
    probs: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.probs is not None and self.probs.shape[0] != len(self.tokens):
            raise ValueError("Draft.probs needs one row per proposed token")


class Drafter(Protocol):
    def begin(self, context: list[int]) -> None:
        """A new request: `context` is every token the target state holds, none pending."""

    def propose(self, pending: int, k: int) -> Draft:
        """Up to k tokens that follow context + [pending]."""

    def commit(self, tokens: list[int]) -> None:
        """`tokens` (the pending one first) joined the context."""

    def end(self) -> None:
        """The request is over (learned data is kept)."""


# -- prompt lookup over a suffix automaton -------------------------------------------


class SuffixDrafter:
    """Proposes what followed the most recent earlier occurrence of the longest suffix
    of context + [pending] anywhere in the history (all requests, all branches).

    The corpus holds every token ever seen, one document per `begin`, each opened by a
    unique negative sentinel so no match spans two documents. A request whose context
    extends the previous document (the next turn of the same chat) continues that
    document instead of indexing its prefix again.

    The matcher needs no state of its own: in a suffix automaton, `link[last]` is the
    state of the longest suffix of the corpus that also occurs earlier, which is
    exactly "the current match"; each append's suffix-link walk is the incremental
    matcher step (amortised O(1), Blumer et al.).
    """

    def __init__(self, min_match: int = 2, recency_depth: int = 32) -> None:
        if min_match < 1:
            raise ValueError("min_match must be at least 1")
        if recency_depth < 0:
            raise ValueError("recency_depth must be >= 0")
        self.min_match = min_match
        self.recency_depth = recency_depth
        self.match_length = 0  # of the last proposal: tokens of context+[pending] matched
        self.corpus: list[int] = []  # read-only for callers
        self.num_documents = 0
        # Automaton state i: outgoing transitions, suffix link, longest length, and an
        # end position (in the corpus) of one occurrence, as recent as we cheaply know.
        self._next: list[dict[int, int]] = [{}]
        self._link = [-1]
        self._len = [0]
        self._last_end = [-1]
        self._last = 0  # the state of the whole corpus
        self._doc_start = 0  # corpus index of the current document's first token

    @property
    def num_states(self) -> int:
        return len(self._len)

    def begin(self, context: list[int]) -> None:
        _check_tokens(context)
        doc = self.corpus[self._doc_start :]
        if self.num_documents and len(context) >= len(doc) and context[: len(doc)] == doc:
            self._extend(context[len(doc) :])
            return
        self.num_documents += 1
        self._append(-self.num_documents)
        self._doc_start = len(self.corpus)
        self._extend(context)

    def propose(self, pending: int, k: int) -> Draft:
        state, length = self._match_with(pending)
        self.match_length = length
        if length < self.min_match or k <= 0:
            return Draft([])
        return Draft(self._continuation(self._last_end[state], pending, k))

    def commit(self, tokens: list[int]) -> None:
        _check_tokens(tokens)
        self._extend(tokens)

    def end(self) -> None:
        pass

    # -- the automaton --------------------------------------------------------------
    def _extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self._append(token)

    def _append(self, token: int) -> None:
        nxt, link, length, last_end = self._next, self._link, self._len, self._last_end
        pos = len(self.corpus)
        self.corpus.append(token)
        cur = len(length)
        nxt.append({})
        link.append(0)
        length.append(length[self._last] + 1)
        last_end.append(pos)
        p = self._last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:  # split q: its suffixes up to length[p] + 1 also end here now
                clone = len(length)
                nxt.append(nxt[q].copy())
                link.append(link[q])
                length.append(length[p] + 1)
                last_end.append(last_end[q])  # endpos(clone) includes endpos(q)
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self._last = cur
        # Recency: exactly the states on cur's suffix-link path have `pos` in their end
        # set. Walking the whole path is O(depth), so only the first `recency_depth`
        # states are moved to `pos`; deeper ones keep an older (still valid) end
        # position. Every stored value is a true end position at all times, which is
        # all correctness needs; "most recent" is exact while paths stay that short.
        x, steps = link[cur], 0
        while x > 0 and steps < self.recency_depth:
            last_end[x] = pos
            x = link[x]
            steps += 1

    def _match_with(self, pending: int) -> tuple[int, int]:
        """State and length of the longest suffix of corpus + [pending] that occurs in
        the corpus, i.e. earlier than this occurrence (never across a document start:
        a string holding a sentinel occurs once). Its end positions are all
        <= len(corpus) - 1, so at least `pending` follows each one."""
        nxt, link, length = self._next, self._link, self._len
        state = link[self._last] if self._last else 0
        while state != -1 and pending not in nxt[state]:
            state = link[state]
        if state == -1:
            return 0, 0
        return nxt[state][pending], length[state] + 1

    def _continuation(self, end: int, pending: int, k: int) -> list[int]:
        """Up to k tokens after position `end` of corpus + [pending], read on into the
        proposal itself when it runs past the end (a repeating loop, as in LZ77)."""
        corpus, n = self.corpus, len(self.corpus)
        out: list[int] = []
        for i in range(end + 1, end + 1 + k):
            token = corpus[i] if i < n else pending if i == n else out[i - n - 1]
            if token < 0:  # the document ended there
                break
            out.append(token)
        return out


def _check_tokens(tokens: list[int]) -> None:
    if min(tokens, default=0) < 0:
        raise ValueError("token ids must be non-negative (negatives are sentinels)")


# -- a small draft model ------------------------------------------------------------


class DraftModelDrafter:
    """A small model sharing the target's tokenizer, drafting one token per forward.

    Between requests its state holds exactly the committed context: `propose`
    checkpoints, drafts, and rolls back; `commit` only queues the committed tokens, which
    the next `propose` (or `end`) forwards in one batched call, so plain steps between
    drafts cost the draft model nothing until it drafts again. With `transform` (a logits
    row and the history -> a probability vector, e.g. engine.sampling.probabilities with the
    request's settings) it samples from q and returns q's rows; without, it is greedy and
    returns probs=None.
    """

    def __init__(
        self,
        model: Model,
        transform: Transform | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        self.model = model
        self.transform = transform
        self.rng = np.random.default_rng(seed)
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
        rows: list[np.ndarray] = []
        try:
            logits = model.forward([pending], state, logits="last")
            for i in range(k):
                row = np.asarray(model.ops.to_numpy(logits), dtype=np.float64)[-1]
                if self.transform is None:
                    token = int(np.argmax(row))
                else:
                    q = np.asarray(self.transform(row, list(state.tokens)), dtype=np.float64)
                    rows.append(q)
                    token = draw(q, self.rng)
                drafted.append(token)
                if i + 1 < k:
                    logits = model.forward([token], state, logits="last")
        finally:
            self._restore(cp)
        probs = np.stack(rows) if self.transform is not None else None
        return Draft(drafted, probs)

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
