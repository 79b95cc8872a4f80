"""Several drafters behind one: each round, the one whose measured acceptance and drafting
cost promise the most tokens per second proposes (engine/decoding.py's cost model, per
member), or none when plain decoding promises more; among those that pay, one that drafts
for free (prompt lookup) goes first whenever it has something to propose.

Every member sees every committed token (and, if it wants them, the target's hidden rows),
so whichever is picked next proposes from the whole context. A member that has nothing to
propose (prompt lookup without a match) gives way to the next best. Output is still exactly
plain decoding's: the pool only chooses who proposes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.draft_costs import (
    MAX_DRAFT,
    AcceptanceModel,
    CostModel,
    best_draft_length,
    cut_draft,
    expected_tokens,
)
from engine.drafters import Draft, Drafter


@dataclass
class Member:
    name: str
    drafter: Drafter
    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)

    @property
    def one_pass(self) -> bool:
        return bool(getattr(self.drafter, "drafts_in_one_pass", False))

    @property
    def free(self) -> bool:
        """Its drafts cost no forward of any model (prompt lookup's)."""
        return bool(getattr(self.drafter, "drafts_for_free", False))


@dataclass
class Choice:
    member: Member
    k: int
    tokens_per_second: float


class PoolAcceptance(AcceptanceModel):
    """The decode loop's acceptance model for a pool: what it learns goes to the member
    that drafted last (its cost per token or per pass as that member drafts), and a plain
    step or a new request ages or clears every member's evidence."""

    def __init__(self, pool: DrafterPool) -> None:
        super().__init__()
        self.pool = pool

    def observe_cost(self, drafted: int, seconds: float, per_pass: bool = False) -> None:
        member = self.pool.last
        if member is not None:
            member.acceptance.observe_cost(drafted, seconds, member.one_pass)

    def observe(self, drafted: int, accepted: int) -> None:
        if self.pool.last is not None:
            self.pool.last.acceptance.observe(drafted, accepted)

    def idle(self) -> None:
        for member in self.pool.members:
            member.acceptance.idle()

    def forget(self) -> None:
        for member in self.pool.members:
            member.acceptance.forget()

    @property
    def rate(self) -> float:
        member = self.pool.last
        return member.acceptance.rate if member is not None else 0.0


class DrafterPool:
    def __init__(self, members: list[Member]) -> None:
        if not members:
            raise ValueError("a drafter pool needs at least one drafter")
        self.members = members
        self.acceptance = PoolAcceptance(self)
        seeing = [m.drafter for m in members if getattr(m.drafter, "wants_hidden", False)]
        self.wants_hidden = bool(seeing)
        self.taps: tuple[int, ...] = getattr(seeing[0], "taps", ()) if seeing else ()
        if any(getattr(d, "taps", ()) != self.taps for d in seeing):
            raise ValueError("a pool's drafters that read the target's rows read one layer set")
        self.last: Member | None = None  # the member whose draft is being verified
        self._ranked: list[Choice] = []
        self._costs: CostModel | None = None  # choose_k's: a free draft's cut
        self.proposals: dict[str, int] = {m.name: 0 for m in members}  # drafts, by member

    # -- the choice --------------------------------------------------------------------
    def choose_k(self, costs: CostModel, room: int) -> int:
        """Rank the members by expected tokens per second at their best k; the largest of
        those k, within which each drafts its own (0: plain decoding beats every member)."""
        ranked, ratios, step = [], costs.ratio_table(), costs.cost(1)
        for member in self.members:
            acc = member.acceptance
            cap = min(room, getattr(member.drafter, "max_draft", room))
            token_s = acc.draft_seconds(costs)
            if getattr(member.drafter, "cuts_own_drafts", False):  # its cut decides
                k = max(0, min(cap, MAX_DRAFT))
            else:
                k = best_draft_length(acc.rate, costs, max(0, cap), token_s, acc.pass_seconds)
            if k:
                seconds = step * ratios[k + 1] + k * token_s + acc.pass_seconds
                ranked.append(Choice(member, k, expected_tokens(acc.rate, k) / seconds))
        self._ranked = sorted(ranked, key=lambda c: -c.tokens_per_second)
        self._costs = costs
        return max((c.k for c in ranked), default=0)

    # -- the Drafter protocol ----------------------------------------------------------
    def begin(self, context: list[int]) -> None:
        for member in self.members:
            member.drafter.begin(context)
        self.last = None

    def couple(self, sample: Any) -> None:
        for member in self.members:
            couple = getattr(member.drafter, "couple", None)
            if couple is not None:
                couple(sample)

    def observe_hidden(self, rows: Any, start: int | None = None) -> None:
        for member in self.members:
            if getattr(member.drafter, "wants_hidden", False):
                args = (rows,) if start is None else (rows, start)
                member.drafter.observe_hidden(*args)  # type: ignore[attr-defined]

    @property
    def drafts_for_free(self) -> bool:
        """Whether every member drafts on the host alone (engine/decoding.py's queued steps)."""
        return all(member.free for member in self.members)

    @property
    def round_is_free(self) -> bool:
        """Whether the members `choose_k` just ranked all draft on the host alone: then the
        next step may be queued before the draft is asked for, as for prompt lookup alone.
        A block drafter that does not pay this round is not asked, so its pass, which would
        wait behind a queued step, does not stop the queue (on an H100 a pool of lookup and
        the block drafter decoded a fresh question at 0.83x where lookup alone gave 0.98x:
        lookup's every k stopped the queue, docs/BENCHMARKS.md)."""
        return all(choice.member.free for choice in self._ranked)

    @property
    def max_draft(self) -> int:
        return max(getattr(m.drafter, "max_draft", MAX_DRAFT) for m in self.members)

    def propose(self, pending: int, k: int) -> Draft:
        """The best-ranked member's draft of its own k (at most `k`), else the next one's.
        Asked without `choose_k` this round (a k forced from outside), the members by
        acceptance rate, each drafting up to k."""
        ranked, self._ranked = self._ranked, []
        if not ranked:
            by_rate = sorted(self.members, key=lambda m: -m.acceptance.rate)
            ranked = [Choice(m, k, m.acceptance.rate) for m in by_rate]
        # A member that pays and drafts for free goes first when it has a draft: its rate
        # is measured on the rounds it had one, and there a model's draft does far worse
        # than its average (open chat on the CPU, `python -m tools.drafter.pool_rounds
        # --rank-only`: 6% of the block drafter's tokens accepted in rounds prompt lookup
        # had a match, 43% of lookup's, 16% of the block drafter's in the others). The
        # stable sort keeps the ranking within each side.
        ranked.sort(key=lambda choice: not choice.member.free)
        for choice in ranked:
            draft = choice.member.drafter.propose(pending, min(k, choice.k))
            if draft.free and self._costs is not None:  # cut to none: the next member's
                draft = cut_draft(draft, self._costs)
            if draft.tokens:
                self.last = choice.member
                self.proposals[choice.member.name] += 1
                return draft
        self.last = None
        return Draft([])

    def judge(self, drafted: int, accepted: int) -> None:
        """The verify's verdict, to the member that drafted, where it keeps its own."""
        judge = getattr(self.last.drafter, "judge", None) if self.last is not None else None
        if judge is not None:
            judge(drafted, accepted)

    def commit(self, tokens: list[int]) -> None:
        for member in self.members:
            member.drafter.commit(tokens)
        self.last = None

    def end(self) -> None:
        for member in self.members:
            member.drafter.end()


def choice_pools(
    lookup: Member, block: Member | None, draft_model: Member | None, block_in_auto: bool
) -> tuple[DrafterPool | None, DrafterPool | None]:
    """The pools behind a session's drafter choices. "block": the block drafter, and lookup
    where it promises more (a regenerate). Auto: every drafter there is, pooled (a draft
    model; the block drafter where `block_in_auto`, where it was measured paying beside
    lookup alone; lookup); None where lookup would be alone."""
    block_pool = DrafterPool([block, lookup]) if block is not None else None
    if draft_model is None:
        return block_pool, block_pool if block_in_auto else None
    models = [draft_model, *([block] if block is not None and block_in_auto else [])]
    return block_pool, DrafterPool([*models, lookup])
