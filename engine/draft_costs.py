"""What speculation costs and yields, as the decode loop weighs it each round: the forward
cost of m rows on this device (`CostModel`), each drafter's acceptance and drafting cost
(`AcceptanceModel`), and the draft length with the most expected tokens per second
(`best_draft_length`, 0 included: never slower than plain decoding)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from engine.drafters import Draft
from engine.runner import ModelRunner
from engine.sequence import SequenceState, prefill

MAX_DRAFT = 16
MARGIN = 1.02  # what speculating must promise over plain decoding: never for a rounding error


class CostModel:
    """Seconds per forward of m rows on this device: the cost of one row times the measured
    ratio cost(m) / cost(1) (EMAs).

    On MLX's CPU backend a verify of m rows costs ~m decode steps; on a GPU or through
    BLAS it is nearly flat in m, which is what makes speculation pay. Ratios rather than
    seconds are kept for m > 1 because they are only measured while speculating: absolute
    verify times taken under a burst of load (at calibration, say) would stay stale once
    they stopped speculation, while plain steps sped up again, and nothing re-measured them.
    """

    def __init__(self, decay: float = 0.8) -> None:
        self.decay = decay
        self.step_seconds: float | None = None  # one row
        self.ratios: dict[int, float] = {1: 1.0}
        # the ratio for rows 0..MAX_DRAFT + 1 and the ratios it was made of: the decode
        # loop weighs every draft length of every drafter each step (on a CPU step of
        # ~2.5 ms, 0.2 ms when each cost was interpolated anew); plain steps change only
        # the one-row cost, verifies the ratios
        self._ratio_table: list[float] = []
        self._made_of: tuple[tuple[int, float], ...] = ()

    @property
    def seconds(self) -> dict[int, float]:
        """The current estimate for every measured row count."""
        return {rows: self.cost(rows) for rows in sorted(self.ratios)}

    def table(self) -> list[float]:
        """cost(rows) for rows 0..MAX_DRAFT + 1 (0 unused)."""
        step = 1.0 if self.step_seconds is None else self.step_seconds
        return [step * ratio for ratio in self.ratio_table()]

    def ratio_table(self) -> list[float]:
        """cost(rows) / cost(1) for rows 0..MAX_DRAFT + 1 (0 unused): not to be changed."""
        made_of = tuple(self.ratios.items())
        if made_of != self._made_of:
            self._ratio_table = [0.0] + [self._ratio(rows) for rows in range(1, MAX_DRAFT + 2)]
            self._made_of = made_of
        return self._ratio_table

    def observe(self, rows: int, seconds: float) -> None:
        if rows == 1:
            self.step_seconds = self._ema(self.step_seconds, seconds)
        elif self.step_seconds is not None:  # a ratio needs the one-row cost first
            self.ratios[rows] = self._ema(self.ratios.get(rows), seconds / self.step_seconds)

    def charge(self, rows: int, seconds: float) -> None:
        """Add `seconds` to the last observation of a forward of `rows` rows: a cost of that
        forward that shows only later (queued plain steps restarted after a verify)."""
        if rows > 1 and rows in self.ratios and self.step_seconds:
            self.ratios[rows] += (1 - self.decay) * seconds / self.step_seconds

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new

    def calibrate(self, runner: ModelRunner) -> None:
        """The one-row cost and the ratios of 2, 4, 8 and 16 rows to it, on a 32-token
        state. The one-row shape is warmed by six untimed forwards (on a CPU the first
        one-row forwards after a prefill ran 4.1, 3.6, 3.2 ms before a steady 2.3, Intel
        Xeon), each other shape by one (a GPU's first call of a shape compiles: the H200's
        fused step 1-4 s). Each ratio is then the fastest of three m-row forwards over the
        fastest of the one-row forwards timed between them, so a drift of the machine's
        speed during calibration moves both: a slow one-row cost read every verify cheap."""
        state = runner.new_state()
        prefill(runner, state, [1] * 32)

        def timed(rows: int) -> float:
            cp = state.checkpoint()
            t0 = time.perf_counter()
            runner.forward([1] * rows, state, logits="all")
            seconds = time.perf_counter() - t0
            state.rollback(cp)
            return seconds

        for _ in range(6):
            timed(1)
        ones: list[float] = []
        ratios = {1: 1.0}
        for rows in (2, 4, 8, 16):
            timed(rows)
            pairs = [(timed(1), timed(rows)) for _ in range(3)]
            ones += [one for one, _ in pairs]
            ratios[rows] = min(m for _, m in pairs) / min(one for one, _ in pairs)
        self.step_seconds = min(ones)
        self.ratios = ratios
        if runner.can_launch_ahead(state) and self.step_seconds:
            # plain steps will be queued (engine/runner/ahead.py): the ratios are then
            # against a queued step, which costs less than the synchronous one timed above
            queued = self._queued_step(runner, state)
            scale = self.step_seconds / queued
            self.ratios = {m: r * scale if m > 1 else r for m, r in self.ratios.items()}
            self.step_seconds = queued

    @staticmethod
    def _queued_step(runner: ModelRunner, state: SequenceState, steps: int = 8) -> float:
        """Seconds a greedy plain step takes queued, each launched on the step before's
        token as it lies on the device (the decode loop's `_plain_run`), after three
        untimed; the state is as it was after."""
        cp = state.checkpoint()
        step = runner.launch([1], state)
        step.end(1)
        t0 = 0.0
        for i in range(3 + steps):
            if i == 3:
                t0 = time.perf_counter()
            nxt = runner.launch(step.top, state)
            nxt.end(step.read())
            step = nxt
        step.read()
        seconds = (time.perf_counter() - t0) / steps
        state.rollback(cp)
        return seconds

    def cost(self, rows: int) -> float:
        step = 1.0 if self.step_seconds is None else self.step_seconds
        return step * self._ratio(rows)

    def _ratio(self, rows: int) -> float:
        ratios = self.ratios
        if rows in ratios:
            return ratios[rows]
        lo = max(m for m in ratios if m < rows)  # 1 is always known
        hi = min((m for m in ratios if m > rows), default=None)
        if hi is not None:
            w = (rows - lo) / (hi - lo)
            return (1 - w) * ratios[lo] + w * ratios[hi]
        # past the top point: linear in the extra rows (with nothing measured: cost(m) = m,
        # never optimistic)
        return ratios[lo] + (rows - lo) * ratios[lo] / lo


@dataclass
class AcceptanceModel:
    """Per-token acceptance of one drafter: a Beta(1, 1) prior plus forgotten evidence.

    Evidence ages per token: `decay` per drafted token judged (so a run of accepts that ends
    is outweighed within a few failed drafts) and `idle_decay` per plain step. Evidence is
    only gathered while drafting, so without the idle ageing, and without dropping it when a
    request begins, a rate that once fell below break-even would never be tested again: a
    regenerate repeating the previous answer after a fresh question got no drafts at all.
    """

    decay: float = 0.9  # per judged draft token: a memory of ~10 of them
    idle_decay: float = 0.98  # per plain step: 35 undrafted tokens halve the evidence
    accepted: float = 0.0
    trials: float = 0.0
    token_seconds: float = 0.0  # what drafting one token costs (a draft model's forward)
    # until the first draft is timed, what a drafted token is taken to cost, in plain
    # steps (a draft model's: its weights' bytes over the target's), so a draft model as
    # large as the target is not tried at the price of forwarding it a whole prompt
    prior_steps: float = 0.0
    pass_seconds: float = 0.0  # what one drafting pass costs, whatever k (a block drafter)

    def observe_cost(self, drafted: int, seconds: float, per_pass: bool = False) -> None:
        if per_pass:
            self.pass_seconds = _ema(self.pass_seconds, seconds)
        else:
            self.token_seconds = _ema(self.token_seconds, seconds / drafted)

    def draft_seconds(self, costs: CostModel) -> float:
        """What drafting one token costs: as measured, else the prior."""
        return self.token_seconds or self.prior_steps * costs.cost(1)

    @property
    def rate(self) -> float:
        return (self.accepted + 1.0) / (self.trials + 2.0)  # the posterior mean

    def observe(self, drafted: int, accepted: int) -> None:
        judged = accepted + (1 if accepted < drafted else 0)
        keep = self.decay**judged
        self.accepted = keep * self.accepted + accepted
        self.trials = keep * self.trials + judged

    def idle(self) -> None:
        """A step without a draft: the evidence ages."""
        self.accepted *= self.idle_decay
        self.trials *= self.idle_decay

    def forget(self) -> None:
        """A new request: whether it repeats earlier text is its own matter."""
        self.accepted = self.trials = 0.0


def _ema(old: float, new: float) -> float:
    return new if not old else 0.8 * old + 0.2 * new


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a verify of k drafts yields when each is accepted with probability alpha (the
    accepted run plus the target's own token after it): 1 + alpha + ... + alpha^k."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_draft_length(
    alpha: float,
    costs: CostModel,
    available: int,
    draft_token_s: float = 0.0,
    draft_pass_s: float = 0.0,
) -> int:
    """k maximising expected tokens per second: (1 - a^(k+1)) / (1 - a) tokens per
    cost(k+1) + k * draft_token_s + draft_pass_s (the verify plus drafting the k tokens,
    a token at a time or in one pass)."""
    table = costs.table()
    best_k, best_rate = 0, 1.0 / table[1]
    tokens, term = 1.0, 1.0  # expected_tokens(alpha, k), a term a k
    for k in range(1, min(available, MAX_DRAFT) + 1):
        term *= alpha
        tokens += term
        rate = tokens / (table[k + 1] + k * draft_token_s + draft_pass_s)
        if rate > best_rate * MARGIN:
            best_k, best_rate = k, rate
    return best_k


def cut_draft(draft: Draft, costs: CostModel, queued: bool = False) -> Draft:
    """A draft with its drafter's confidence (P_j: tokens 1..j all accepted) cut at the k
    with the most expected tokens per second, (1 + P_1 + ... + P_k) / cost(k + 1); where a
    plain step queued on the pending token gives the first row (`queued`), over that step
    and a pass of the k drafts, cost(1) + cost(k). One token at least stays of a draft whose
    pass was paid (its verdict feeds the acceptance model); a free draft (prompt lookup's)
    is dropped where that best k does not beat plain decoding by the margin."""
    tokens, confidence = draft.tokens, draft.confidence
    if len(confidence) != len(tokens) or not tokens or (len(tokens) == 1 and not draft.free):
        return draft
    # plain floats over at most MAX_DRAFT tokens, in plain steps from the model's table of
    # ratios: asked every round lookup matches, on a GPU inside a queued step's host part
    # (NumPy's fixed cost was most of a short draft's cut)
    ratios = costs.ratio_table() if len(tokens) <= MAX_DRAFT else None
    total, best, keep = 0.0, 0.0, 0
    first = 1.0 if queued else 0.0  # the queued step, plain decoding's too
    for k, p in enumerate(confidence, 1):
        total += p  # expected tokens: 1 + P_1 + ... + P_k
        rows = k if queued else k + 1
        steps = ratios[rows] if ratios is not None else costs.cost(rows) / costs.cost(1)
        rate = (1.0 + total) / (first + steps)  # tokens a plain step's time
        if rate > best:  # the first k of the highest rate
            best, keep = rate, k
    if draft.free and best <= MARGIN:
        keep = 0
    if keep == len(tokens):
        return draft
    return replace(draft, tokens=tokens[:keep], confidence=confidence[:keep])
