"""Prompt lookup for speculative decoding: `SuffixDrafter` proposes what followed the
longest match of the text's end anywhere in the conversation history, every request
and every branch, through a suffix automaton over a trie of what was seen.
"""

from __future__ import annotations

from typing import Any

from engine.drafters import Draft
from engine.match_acceptance import MatchAcceptance

# What the index costs in Python objects, per automaton state, per transition and per
# trie node (list slots, dict entries, int objects; CPython 3.11, 64-bit), measured with
# tracemalloc on conversation-like text (tests/engine/test_drafter_corpus.py checks it)
STATE_BYTES = 180
TRANSITION_BYTES = 90
NODE_BYTES = 195
DEFAULT_BUDGET_BYTES = 64 << 20


class SuffixDrafter:
    """Proposes what followed the most recent occurrence of the longest suffix of
    context + [pending] anywhere in the history (all requests, all branches).

    The history is a trie of token sequences, one path per request's context and reply,
    so every distinct sequence is held once: a regenerate re-sends its prompt, the next
    turn extends the previous path, an edit shares the path up to the edit, and each of
    them only adds the tokens the trie lacks. Over it sits a generalized suffix automaton
    (Blumer et al. 1985, "The smallest automaton recognizing the subwords of a text",
    built online from the trie as in Mohri, Moreno & Weinstein 2009), which recognizes
    every substring of every path; paths never join, so no match spans two of them.

    The match: reading `pending` from the state of the whole current path (the context
    and what was committed since) by the usual suffix-link walk gives the longest suffix
    of context + [pending] that occurs in the history; `pending` itself is not indexed
    yet, so every occurrence found is an earlier one (or the path a regenerate is
    retracing). The proposal reads on from an end of that occurrence along the trie,
    the most recently taken child first.

    Memory: `nbytes()` estimates the index; past `set_budget(max_bytes)` (checked when a
    request ends and when the budget changes between requests) the index is rebuilt from
    the most recent paths that fit half the budget, newest first, the newest one cut to
    its last tokens if it alone does not fit; older paths are forgotten.
    """

    drafts_for_free = True  # a walk in the index, no model's forward (engine/drafter_pool.py)
    # its drafts carry a confidence by their match's length: asked every round for the most
    # rows, and its cut (draft_costs.cut_draft) decides how many, none included
    cuts_own_drafts = True

    def __init__(
        self,
        min_match: int = 2,
        recency_depth: int = 32,
        max_bytes: int | None = DEFAULT_BUDGET_BYTES,
    ) -> None:
        if min_match < 1:
            raise ValueError("min_match must be at least 1")
        if recency_depth < 0:
            raise ValueError("recency_depth must be >= 0")
        self.min_match = min_match
        self.recency_depth = recency_depth
        self.max_bytes = _checked_budget(max_bytes)
        self.match_length = 0  # of the last proposal: tokens of context+[pending] matched
        # how often a drafted token stands, by the match it continues: the drafts'
        # confidence, judged by every verify (engine/match_acceptance.py). Greedy and
        # sampled requests keep their own: from twelve tokens and more, 96% of greedy
        # drafted tokens stood on open chat and 24% of sampled ones (temperature 0.7)
        self._rates = (MatchAcceptance(), MatchAcceptance())  # greedy, sampled
        self._sampled = False  # the request's: set by `couple`
        # the last proposal no verify judged (its cut dropped it): the path's length then,
        # its match's length, its first token. The next proposal's pending token, one
        # past it, is the token a verify would have judged that first token against (a
        # sampled verify draws with plain decoding's uniform there): its verdict, free
        self._unjudged: tuple[int, int, int] | None = None
        self.num_rebuilds = 0
        self._in_request = False
        self._clear()

    def _clear(self) -> None:
        # The trie: node 0 is the empty sequence; node i > 0 is token _tok[i] after _parent[i]
        self._tok = [-1]
        self._parent = [-1]
        self._depth = [0]
        self._child: dict[int, int] = {}  # node << 32 | token -> child node
        self._recent_child = [-1]  # the child taken last, where a proposal reads on
        self._sam_of = [0]  # automaton state whose longest string is the node's path
        self._ends: dict[int, None] = {}  # nodes where a request's path ended, oldest first
        # Automaton state i: outgoing transitions, suffix link, longest length, and a trie
        # node where one occurrence ends, as recent as we cheaply know.
        self._next: list[dict[int, int]] = [{}]
        self._link = [-1]
        self._len = [0]
        self._end = [0]
        self._num_transitions = 0
        self._node = 0  # the current path's end: context + committed tokens

    # -- sizes ------------------------------------------------------------------------
    @property
    def num_states(self) -> int:
        return len(self._len)

    @property
    def num_tokens(self) -> int:
        """Tokens indexed: the distinct sequences' tokens, each shared prefix once."""
        return len(self._tok) - 1

    def nbytes(self) -> int:
        """An estimate of the bytes the index holds (the constants above)."""
        return (
            self.num_states * STATE_BYTES
            + self._num_transitions * TRANSITION_BYTES
            + len(self._tok) * NODE_BYTES
        )

    def set_budget(self, max_bytes: int | None) -> None:
        """Bound the index (None: unbounded); enforced now unless a request is running."""
        self.max_bytes = _checked_budget(max_bytes)
        if not self._in_request:
            self._enforce_budget()

    def path(self, node: int | None = None) -> list[int]:
        """The tokens from the trie's root to `node` (default: the current path)."""
        node = self._node if node is None else node
        out: list[int] = []
        while node > 0:
            out.append(self._tok[node])
            node = self._parent[node]
        return out[::-1]

    # -- the Drafter protocol ---------------------------------------------------------
    @property
    def match_rates(self) -> MatchAcceptance:
        """The running request's rates (greedy or sampled)."""
        return self._rates[self._sampled]

    def couple(self, sample: Any) -> None:
        """The request draws with `sample` (engine/drafters.py): its drafts are judged by
        that draw, so the sampled rates are its. Lookup's proposals stay what they are."""
        settings = getattr(sample, "settings", None)
        self._sampled = sample is not None and not (settings is not None and settings.is_greedy)

    def begin(self, context: list[int]) -> None:
        _check_tokens(context)
        self._sampled = False  # until `couple` says otherwise
        self._unjudged = None
        self._in_request = True
        for rates in self._rates:  # what verified drafts got is the request's own
            rates.new_request()
        self._node = 0
        self._extend(context)

    def propose(self, pending: int, k: int) -> Draft:
        self._judge_unverified(pending)
        state, length = self._match_with(pending)
        self.match_length = length
        if length < self.min_match or k <= 0:
            return Draft([])
        tokens = self._continuation(self._end[state], pending, k)
        if tokens:
            self._unjudged = (self._depth[self._node], length, tokens[0])
        confidence = self.match_rates.confidence(length, len(tokens))
        return Draft(tokens, confidence, free=True)

    def judge(self, drafted: int, accepted: int) -> None:
        """The verify's verdict on the last proposal's first `drafted` tokens."""
        self._unjudged = None
        self.match_rates.judge(self.match_length, drafted, accepted)

    def _judge_unverified(self, pending: int) -> None:
        """The verdict on the last proposal's first token where no verify gave one and
        `pending` stands where it would have (the path one token longer since)."""
        unjudged, self._unjudged = self._unjudged, None
        if unjudged is not None and unjudged[0] + 1 == self._depth[self._node]:
            self.match_rates.judge(unjudged[1], 1, int(unjudged[2] == pending), verified=False)

    def commit(self, tokens: list[int]) -> None:
        _check_tokens(tokens)
        self._extend(tokens)
        self.match_rates.age(len(tokens))

    def end(self) -> None:
        self._unjudged = None
        self._ends.pop(self._node, None)
        self._ends[self._node] = None  # the newest path
        self._in_request = False
        self._enforce_budget()

    # -- the trie and the automaton ---------------------------------------------------
    def _extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self._step(token)

    def _step(self, token: int) -> None:
        """Move the current path on by `token`, indexing it if the trie lacks it."""
        u = self._node
        key = u << 32 | token
        v = self._child.get(key)
        if v is None:
            v = len(self._tok)
            self._tok.append(token)
            self._parent.append(u)
            self._depth.append(self._depth[u] + 1)
            self._recent_child.append(-1)
            self._child[key] = v
            self._sam_of.append(self._sam_extend(self._sam_of[u], token, v))
        self._recent_child[u] = v
        self._node = v
        self._touch(self._sam_of[v], v)

    def _touch(self, state: int, node: int) -> None:
        """Recency: the states on `state`'s suffix-link path all have an occurrence ending
        at `node`. Walking the whole path is O(depth), so only the first `recency_depth`
        are moved there; deeper ones keep an older (still valid) end. Every stored value is
        a true end at all times, which is all correctness needs; "most recent" is exact
        while paths stay that short."""
        end, link = self._end, self._link
        end[state] = node
        x, steps = link[state], 0
        while x > 0 and steps < self.recency_depth:
            end[x] = node
            x = link[x]
            steps += 1

    def _new_state(self, length: int, link: int, transitions: dict[int, int], end: int) -> int:
        self._next.append(transitions)
        self._link.append(link)
        self._len.append(length)
        self._end.append(end)
        self._num_transitions += len(transitions)
        return len(self._len) - 1

    def _sam_extend(self, last: int, token: int, node: int) -> int:
        """The state of (the string of `last`) + token, added to the automaton: the online
        construction, with the generalized case of a transition that already exists
        (the extended string occurs elsewhere in the history)."""
        nxt, length = self._next, self._len
        if token in nxt[last]:
            q = nxt[last][token]
            if length[q] == length[last] + 1:
                return q
            return self._split(last, token, q)
        cur = self._new_state(length[last] + 1, 0, {}, node)
        p = last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            self._num_transitions += 1
            p = self._link[p]
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                self._link[cur] = q
            else:
                self._link[cur] = self._split(p, token, q)
        return cur

    def _split(self, p: int, token: int, q: int) -> int:
        """Split q: its strings up to length[p] + 1 move to a clone (which they share with a
        new end); p's suffix-link path is redirected to it."""
        nxt = self._next
        # endpos(clone) includes endpos(q), so q's end is one of the clone's
        clone = self._new_state(self._len[p] + 1, self._link[q], nxt[q].copy(), self._end[q])
        while p != -1 and nxt[p].get(token) == q:
            nxt[p][token] = clone
            p = self._link[p]
        self._link[q] = clone
        return clone

    def _match_with(self, pending: int) -> tuple[int, int]:
        """State and length of the longest suffix of the current path + [pending] that
        occurs in the history."""
        nxt, link, length = self._next, self._link, self._len
        state = self._sam_of[self._node]
        while state != -1 and pending not in nxt[state]:
            state = link[state]
        if state == -1:
            return 0, 0
        return nxt[state][pending], length[state] + 1

    def _continuation(self, node: int, pending: int, k: int) -> list[int]:
        """Up to k tokens after trie node `node`, along the most recently taken children.
        Past the current path's end the text is `pending` and then the proposal itself (a
        repeating loop, as in LZ77): out[i] = out[i - period] from there on."""
        out: list[int] = []
        start, period = node, 0
        while len(out) < k:
            if period:
                out.append(out[-period])
            elif node == self._node:
                out.append(pending)
                period = self._depth[node] - self._depth[start] + 1
            else:
                node = self._recent_child[node]
                if node < 0:  # the path ended there
                    break
                out.append(self._tok[node])
        return out

    def _enforce_budget(self) -> None:
        """Past the budget, rebuild from the newest paths that fit half of it."""
        if self.max_bytes is None or self.nbytes() <= self.max_bytes:
            return
        per_token = self.nbytes() / max(1, self.num_tokens)
        room = int(self.max_bytes / 2 / per_token)  # tokens to keep
        kept: list[list[int]] = []
        marked: set[int] = set()
        for node in reversed(self._ends):
            new = []
            x = node
            while x > 0 and x not in marked:  # the nodes no newer kept path shares
                new.append(x)
                x = self._parent[x]
            if len(marked) + len(new) > room:
                if not kept and room:  # the newest path alone does not fit: its last tokens
                    kept.append(self.path(node)[-room:])
                break
            marked.update(new)
            kept.append(self.path(node))
        self._clear()
        for tokens in reversed(kept):  # oldest first, so recency stays in order
            self._node = 0
            self._extend(tokens)
            self._ends[self._node] = None
        self._node = 0
        self.num_rebuilds += 1


def _checked_budget(max_bytes: int | None) -> int | None:
    if max_bytes is not None and max_bytes < 0:
        raise ValueError("the drafter's budget must be >= 0 bytes (or None: unbounded)")
    return max_bytes


def _check_tokens(tokens: list[int]) -> None:
    if tokens and not (min(tokens) >= 0 and max(tokens) < 1 << 32):
        raise ValueError("token ids must be in [0, 2**32)")
