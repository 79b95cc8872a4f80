"""The decode loop: plain or speculative, chosen step by step by expected speed.

Invariant: `pending` is the last sampled token; it is emitted but not yet in the state.
A step forwards [pending] + k drafted tokens in ONE batched pass (k = 0 is plain
decoding), accepts the longest prefix the target agrees with plus one token of its
own, and keeps the state exact with `rollback_retaining` (attention trims rows,
recurrent layers replay the kept rows from the verify tape; no second pass). Where a plain
step on [pending] is queued on the device already (`_plain_run`), that step is the verify's
first row and the pass forwards the k drafted tokens behind it.

Acceptance is coupled sampling: the target's token at each verified row is drawn
exactly as plain decoding draws it there (engine/sampling.py: one uniform per position,
from the seed and the position alone), and a drafted token is accepted iff it equals
that token; after k accepts the last row gives the bonus token. So every token is the
one plain seeded decoding emits, for any draft length and any drafter, and the output
distribution is the target's. A draft that is a function of the context alone (prompt
lookup) is accepted with probability p(d) and a rejection emits a token distributed as
normalize(max(0, p - q)) for its one-hot q, as speculative rejection sampling does
(Leviathan et al. 2023; Chen et al. 2023): the same acceptance. A draft model drawing
with the request's own uniforms (`couple`, engine/drafters.py) agrees with the target
wherever their inverse CDFs do. Greedy: "accept while d == argmax".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine import device_sampling, sampling, verify_rows
from engine.draft_costs import (
    MAX_DRAFT,
    AcceptanceModel,
    CostModel,
    best_draft_length,
    cut_draft,
)
from engine.drafters import Draft, Drafter
from engine.events import FinishReason
from engine.runner import ModelRunner
from engine.runner.ahead import Launch, StepTimedOut, Taps
from engine.sampling import SamplingSettings
from engine.sequence import SequenceState, truncate


@dataclass
class DecodeRequest:
    settings: SamplingSettings
    max_tokens: int
    eos_ids: frozenset[int]
    emit: Callable[[list[int], list[bool]], None]
    should_stop: Callable[[], bool]
    drafter: Drafter | None = None
    acceptance: AcceptanceModel | None = None
    context_limit: int = 1 << 30
    # the prompt's last-layer rows, (start position, rows) per prefill chunk, for a drafter
    # that wants them (`wants_hidden`, engine/drafters.py)
    prompt_hidden: list[tuple[int, Any]] = field(default_factory=list)


@dataclass
class DecodeResult:
    token_ids: list[int] = field(default_factory=list)
    reason: str = FinishReason.LENGTH
    drafted: int = 0
    accepted: int = 0
    verifies: int = 0  # forwards that verified a draft
    first_token_time: float = 0.0
    end_time: float = 0.0


def decode(
    runner: ModelRunner,
    state: SequenceState,
    last_logits: np.ndarray,
    req: DecodeRequest,
    costs: CostModel,
) -> DecodeResult:
    """Generate from `last_logits` (the row after the state's last token) until done.

    On return the state holds the prompt and every produced token but the last one (the
    pending token, or the EOS), and nothing else: rows verified past an accepted EOS are
    dropped with the rest of the draft.
    """
    uniforms = sampling.PositionalUniforms(req.settings.seed)
    s = req.settings
    # a verify must fit one fused step (its rows then match single steps bit for bit)
    row_limit = runner.step_row_limit()
    # plain greedy needs only each row's argmax: take that on the device, not the logits
    argmax_only = s.is_greedy and s.repetition_penalty == 1.0
    out = DecodeResult()
    produced = [(sampling.sample(last_logits, state.tokens, s, uniforms), False)]
    out.first_token_time = time.perf_counter()
    drafter = req.drafter
    hidden = drafter is not None and getattr(drafter, "wants_hidden", False)
    if drafter is not None:
        drafter.begin(list(state.tokens))
        couple = getattr(drafter, "couple", None)  # see engine/drafters.py
        if couple is not None and not argmax_only:
            couple(sampling.CoupledSampler(s, uniforms))
        for start, rows in req.prompt_hidden if hidden else ():
            drafter.observe_hidden(rows, start)  # type: ignore[attr-defined]
    per_pass = bool(getattr(drafter, "drafts_in_one_pass", False))
    # plain steps can go to the device before the host reads their input token: greedy, or
    # sampled where the device can draw the token too (engine/device_sampling.py); a step
    # hands a drafter that reads the target's rows (`taps`) its rows as a forward does
    ahead = argmax_only or device_sampling.can_draw(s)
    taps: Taps = tuple(getattr(drafter, "taps", ())) if hidden else None

    def forward(rows: list[int], logits: str) -> Any:
        if not hidden:
            return runner.forward(rows, state, logits=logits), None
        return runner.forward_hidden(rows, state, logits, getattr(drafter, "taps", ()))

    if req.acceptance is not None:
        req.acceptance.forget()
    carried: _Carried | None = None  # a draft proposed while a queued step ran
    verified = 0  # rows of the verify just done (0: the last forward was a plain step)
    while True:
        reason = _take(produced, out, req)
        if carried is None or carried.head is None:  # else _plain_run checked its token
            if not reason and req.should_stop():
                reason = FinishReason.STOPPED
            if not reason and state.offset + 1 >= req.context_limit:
                reason = FinishReason.CONTEXT_FULL
        if reason:
            out.reason = reason
            break
        pending = out.token_ids[-1]
        head: Launch | None = None  # the queued step on [pending]: the verify's first row
        if carried is not None:  # cut already, priced as it is verified
            k, draft, spent, head = carried.k, carried.draft, carried.seconds, carried.head
            offered, started, carried = min(k, len(draft.tokens)), carried.started, None
        else:
            k = _choose_k(req, costs, len(out.token_ids), state, row_limit)
            t0 = time.perf_counter()
            draft = drafter.propose(pending, k) if (drafter is not None and k) else Draft([])
            spent = time.perf_counter() - t0 - draft.setup_seconds  # a prompt's: not k's cost
            offered = min(k, len(draft.tokens))
            draft = cut_draft(draft, costs)
        if draft.free:  # its cut rows were judged by its own confidence, not missed
            offered = len(draft.tokens)
        if draft.tokens and req.acceptance is not None:
            req.acceptance.observe_cost(len(draft.tokens), spent, per_pass)
        rows = [pending, *draft.tokens[:k]]
        if len(rows) == 1 and ahead and runner.can_launch_ahead(state, taps):
            reason, carried = _plain_run(
                runner, state, req, out, costs, row_limit, uniforms, taps, verified
            )
            if reason:
                out.reason = reason
                break
            produced, verified = [], 0
            continue
        fed = rows[1:] if head is not None else rows  # what this round's forward takes
        t0, verified = time.perf_counter(), len(fed) if len(rows) > 1 else 0
        if len(rows) == 1:
            result, hidden_rows = forward(rows, "last")
            logits = verify_rows.to_host(runner.ops, result, s)
            token = verify_rows.token(logits, -1, state.tokens, len(state.tokens), s, uniforms)
            costs.observe(1, time.perf_counter() - t0)  # with the host's draw, as a verify's
            if req.acceptance is not None:
                req.acceptance.idle()
            if drafter is not None:
                if hidden:
                    drafter.observe_hidden(hidden_rows)  # type: ignore[attr-defined]
                drafter.commit(rows)
            produced = [(token, False)]
            continue
        cp = state.checkpoint(record=True)
        result, hidden_rows = forward(fed, "all")
        logits = verify_rows.to_host(runner.ops, result, s)
        if head is not None:
            logits = verify_rows.Headed(head, logits)
        num_drafted = len(rows) - 1
        try:
            accepted, nxt = verify_rows.verify(
                logits, draft, num_drafted, state.tokens, s, uniforms
            )
        except StepTimedOut:  # the queued first row is not the model's: _plain_run's remedy
            state.rollback_retaining(cp, 0)
            truncate(runner, state, state.offset - 1)
            runner.fall_back()
            produced, verified = [], 0
            continue
        # the host's draws from the rows (a sampled verify's rejection sampling) are the
        # verify's cost, as a plain step's draw is the step's; behind a queued step, what
        # passed since that step began beyond a step's cost (plain decoding waits that too)
        forward_s = time.perf_counter() - t0
        if head is not None:
            forward_s = max(0.0, time.perf_counter() - started - costs.cost(1))
        if req.acceptance is not None:  # per row asked for (a cut's rows count as missed)
            req.acceptance.observe(offered, accepted)
        judge = getattr(drafter, "judge", None)  # a drafter's own confidence model
        if judge is not None:
            judge(num_drafted, accepted)
        eos_at = _first_eos(draft.tokens[:accepted], req.eos_ids)
        if eos_at is not None:
            # the reply ends at an accepted EOS: drafts after it are no part of it (neither
            # kept in the state nor counted), and the EOS is the target's token there
            num_drafted = accepted = eos_at
            nxt = draft.tokens[eos_at]
        t0 = time.perf_counter()
        kept = accepted if head is not None else 1 + accepted  # of the rows forwarded
        if kept == len(fed):
            state.commit(cp)
        else:
            state.rollback_retaining(cp, kept)
        # a verify costs its forward plus putting the state right after it (a hybrid's tape
        # replay of the kept rows): that sum is what plain decoding is weighed against (a
        # one-row pass behind a queued step is no plain step's cost)
        if len(fed) > 1:
            costs.observe(len(fed), forward_s + time.perf_counter() - t0)
        out.drafted += num_drafted
        out.accepted += accepted
        out.verifies += 1
        if drafter is not None:
            if hidden:  # the kept rows are the state's: the rest were rolled back
                if head is not None:
                    drafter.observe_hidden(head.hidden)  # type: ignore[attr-defined]
                if kept:
                    drafter.observe_hidden(hidden_rows[:kept])  # type: ignore[attr-defined]
            drafter.commit(rows[: 1 + accepted])
        produced = [(t, True) for t in draft.tokens[:accepted]] + [(nxt, False)]
    if drafter is not None:
        drafter.end()
    out.end_time = time.perf_counter()
    return out


@dataclass
class _Carried:
    """A draft proposed inside `_plain_run` once a step's token was read: the next round's."""

    k: int
    draft: Draft  # cut as its verify is priced
    seconds: float  # what proposing it cost
    head: Launch | None  # the step queued on the draft's pending token, kept: its first row
    started: float  # when that step's wait began (perf_counter)


def _plain_run(
    runner: ModelRunner,
    state: SequenceState,
    req: DecodeRequest,
    out: DecodeResult,
    costs: CostModel,
    row_limit: int,
    uniforms: sampling.PositionalUniforms,
    taps: Taps = None,
    verified: int = 0,
) -> tuple[str, _Carried | None]:
    """Plain steps from the pending token, each queued on the device before the host reads
    the token it takes (engine/runner/ahead.py). Greedy, a step's input is the step
    before's argmax as it lies on the device; sampled, the device's draw
    (engine/device_sampling.py), and where the host's own draw differs the queued step is
    undone and launched again on the host's token.

    Where the cost model would draft after a step, a drafter that drafts on the host
    (`drafts_for_free`: prompt lookup; a pool whose members ranked this round all do)
    needs that step's token to propose, so the next step is queued all the same and the
    drafter asked once the token is read: with nothing to propose (or a free draft its cut
    drops) the queued step stands; with a draft too, as the verify's first row (undone where
    the host drew another token), and the draft goes back to the loop, for its verify. A
    drafter whose pass runs on the device would wait behind the queued step, so there the
    run ends and the loop drafts. A drafter that reads the target's rows (`taps` not None)
    is handed each step's with its token.

    The run's first step waits for its kernel unoverlapped. After a verify (`verified` its
    rows) that wait beyond a queued step's cost is the verify's: it stopped the queue. It is
    charged to that verify's cost, and the step is not taken as a plain step's cost.

    Returns (a finish reason, or "" with the state as after a plain step: the last token
    read pending, for the loop to go on from; the draft proposed on that token, if any)."""
    s = req.settings
    greedy = s.is_greedy

    def launch(ids: Any) -> Launch:
        # the token drawn from this step's logits lies one past its input's position
        draw = None if greedy else device_sampling.draw(s, uniforms.uniform(state.offset + 1))
        return runner.launch(ids, state, draw, taps)

    pending = out.token_ids[-1]
    step = launch([pending])
    step.end(pending)
    t0 = time.perf_counter()
    while True:
        if req.acceptance is not None:  # a step without a draft, before the next one's k
            req.acceptance.idle()
        num_after = len(out.token_ids) + 1  # produced once this step's token is read
        more = num_after < req.max_tokens and state.offset + 1 < req.context_limit
        k = _choose_k(req, costs, num_after, state, row_limit) if more else 0
        nxt = launch(step.top) if more and (k == 0 or _drafts_for_free(req.drafter)) else None
        try:
            guess = step.read()
            # the host's draw from the row (its history: the state, the queued step not in it)
            token = guess if greedy else verify_rows.host_draw(step, state.tokens, s, uniforms)
        except StepTimedOut:  # its row is not the model's: the loop redoes it another way
            if nxt is not None:
                nxt.cancel()
            truncate(runner, state, state.offset - 1)
            runner.fall_back()
            return "", None
        now = time.perf_counter()
        if verified:  # the restart after a verify: its cost, not a plain step's
            costs.charge(verified, max(0.0, now - t0 - costs.cost(1)))
            verified = 0
        else:
            costs.observe(1, now - t0)
        t0 = now
        if req.drafter is not None:
            if taps is not None:
                req.drafter.observe_hidden(step.hidden)  # type: ignore[attr-defined]
            req.drafter.commit([pending])
        reason = _take([(token, False)], out, req)
        if reason or nxt is None or req.should_stop():
            if nxt is not None:  # its input ended the reply
                nxt.cancel()
            return reason, None  # or the loop drafts on the token read
        if k and req.drafter is not None:
            # the draft's cost is its proposal's alone: the token's emission and commit
            # above are every step's (timed from t0 they made lookup's drafted token cost
            # ~0.2 ms, and Auto on a GPU stopped drafting with it)
            t_draft = time.perf_counter()
            draft = req.drafter.propose(token, k)
            # the step queued on the token the host took is the verify's first row: the
            # draft costs that step (plain decoding's too) and a pass of its own tokens
            kept = token == guess
            draft = cut_draft(draft, costs, queued=kept)
            if draft.tokens:
                seconds = time.perf_counter() - t_draft - draft.setup_seconds
                if kept:
                    nxt.end(token)
                else:
                    nxt.cancel()
                return "", _Carried(k, draft, seconds, nxt if kept else None, t0)
        if token != guess:  # the device drew another token: the queued step is not this one
            nxt.cancel()
            nxt = launch([token])
        nxt.end(token)
        step, pending = nxt, token


def _drafts_for_free(drafter: Any) -> bool:
    """Whether the drafter asked this round drafts on the host alone (a pool: the members
    its `choose_k` ranked)."""
    free = getattr(drafter, "round_is_free", None)
    return bool(getattr(drafter, "drafts_for_free", False) if free is None else free)


def _first_eos(tokens: list[int], eos_ids: frozenset[int]) -> int | None:
    return next((i for i, token in enumerate(tokens) if token in eos_ids), None)


def _take(produced: list[tuple[int, bool]], out: DecodeResult, req: DecodeRequest) -> str:
    """Record and emit newly produced tokens up to an EOS or the token limit."""
    ids: list[int] = []
    flags: list[bool] = []
    reason = ""
    for token, from_draft in produced:
        if token in req.eos_ids:
            reason = FinishReason.EOS
            break
        ids.append(token)
        flags.append(from_draft)
        if len(out.token_ids) + len(ids) >= req.max_tokens:
            reason = FinishReason.LENGTH
            break
    if ids:
        out.token_ids.extend(ids)
        req.emit(ids, flags)
    return reason


def _choose_k(
    req: DecodeRequest, costs: CostModel, produced: int, state: SequenceState, row_limit: int
) -> int:
    if req.drafter is None or req.acceptance is None:
        return 0
    # k drafts yield up to k + 1 tokens: a row past the token limit is verified for nothing;
    # and a verify may not forward more rows than the state can take back (a sliding ring)
    room = min(
        req.max_tokens - produced - 1,
        req.context_limit - state.offset - 2,
        row_limit - 1,
        state.max_verify_rows() - 1,
    )
    choose = getattr(req.drafter, "choose_k", None)
    if choose is not None:  # a pool of drafters picks the drafter and its k together
        return int(choose(costs, max(0, room)))
    room = min(room, getattr(req.drafter, "max_draft", room))
    if getattr(req.drafter, "cuts_own_drafts", False):  # prompt lookup: its cut decides
        return max(0, min(room, MAX_DRAFT))
    acc = req.acceptance
    token_s = acc.draft_seconds(costs)
    return best_draft_length(acc.rate, costs, max(0, room), token_s, acc.pass_seconds)
