"""How often prompt lookup's drafted tokens are right, by the length of the match they
continue: its drafts' confidence (engine/drafters.py's `Draft.confidence`), so the decode
loop cuts a draft where its expected tokens per second peak, or drops it.

A match of two tokens (the least `SuffixDrafter` drafts from) is a weak cue: on the CPU's
`bench speculative` workloads lookup's drafts from one were accepted 17% (a fresh
question) to 39% (mixed) of the time, from five to eight tokens 45-70%, from twelve and
more over 90%. One rate for all of lookup's drafts mixes those: it either drafts on every
short match of a fresh question, where the drafts lose, or stops before a long one.

The model: a drafted token that continues a match of L tokens is accepted, the tokens
before it in the draft accepted, with probability `rate(L)`; the draft's j-th token
continues a match of L + j - 1 once the j - 1 before it stood. Each length (lengths past
`LONGEST` count as `LONGEST`) keeps a Beta posterior whose evidence ages per verdict, so a
conversation's own text moves it, and per token decoded, so a length whose drafts stopped
paying is tried again later: drafts are its only evidence, and without the ageing two
misses where a regenerate leaves the earlier reply would end drafting from long matches
for good. It is kept for the drafter's life, across requests: how well a match of a given
length predicts is the model's and the user's habit, not one request's.

A draft's later tokens are judged apart as well. The model prices the j-th token of a
draft from a match of L as the first token of a match of L + j - 1, and most verdicts are
first tokens (every dropped proposal's). But a draft follows one earlier occurrence for all
its tokens, while each step's proposal picks the occurrence that matches best so far, so
the later tokens of a draft can stand less often than first tokens at the same length. On
an H100, a fresh chat on the Llama-3.2-1B shape's text verified drafts whose rates promised
~3 accepted tokens, got 1.6, and Auto ran at 0.83x plain decoding (docs/BENCHMARKS.md,
session 36). So the tokens after a verified draft's first that stood, over what their
rates promised (each the rate at its length, aged alike), scale the rate of every later
token of the drafts the request proposes after (`later`, never above 1). A draft whose
first token falls is no verdict on it: a regenerate's first miss leaves its long drafts be.

And a draft's confidence takes each rate a quarter of a standard deviation below its mean
(the Beta's: a rate from few verdicts counts for less). A draft is verified where its rates
are highest, and of a dozen lengths with a few verdicts each the highest are high by chance
as often as not: that chat's verified drafts lost their first token 5 times in 12, where
their rates promised 0.83-0.91. Priced by that H100's costs (`python -m bench priced`, one
path each, whose figures move by a few percent with any one decision), Auto read the chat
at 0.87x plain decoding before either change, 0.91x with `later`, 0.99x with both (half a
deviation: also 0.99x, but the default model's regenerate 1.46x against 1.63x before);
regenerate 1.05x, 1.05x, 1.04x; a repeated question 1.61x throughout. On the default model,
priced by session 31's H100 costs: chat 1.01x -> 1.00x, open chat 1.10x -> 1.10x, mixed
1.29x -> 1.24x, regenerate 1.63x -> 1.58x, code 3.91x -> 3.88x.
"""

from __future__ import annotations

import numpy as np

LONGEST = 16  # matches longer than this are judged with it
PRIOR_TRIALS = 2.0  # the prior's weight, in verdicts
DECAY = 0.98  # per verdict at a length: the latest ~50 of them count
AGE = 0.997  # per token decoded: 230 tokens halve every length's evidence
LATER_PRIOR = 2.0  # `later`'s prior weight, in promised tokens (1 before any verdict)
LATER_DECAY = 0.9  # per later token judged: the latest ~10 of them count
DOUBT = 0.25  # a rate's standard deviations off its mean, in a draft's confidence


def prior_rate(length: int) -> float:
    """Before any verdict: (L - 1) / (L + 1): a third for the shortest match lookup drafts
    from by default (two tokens), 0.6 from four, 0.88 from sixteen, near what the CPU's
    workloads measured. From one token: 0, so such a draft is always dropped (a lookup
    with min_match 1 drafts from two tokens on)."""
    return (length - 1.0) / (length + 1.0)


_PRIORS = [PRIOR_TRIALS * prior_rate(length) for length in range(LONGEST + 1)]


class MatchAcceptance:
    def __init__(self) -> None:
        self.accepted = np.zeros(LONGEST + 1)  # aged verdicts, by match length
        self.trials = np.zeros(LONGEST + 1)
        # the request's verified drafts' tokens after their first (aged alike): those that
        # stood, and the sum of their rates (what the model promised of each)
        self.later_stood = 0.0
        self.later_promised = 0.0
        self._unaged = 0  # tokens decoded since the evidence was last aged

    @property
    def later(self) -> float:
        """What a draft's tokens after its first got over what their rates promised, at
        most 1 (1 before any verdict): the rate of each such token is scaled by it."""
        self._settle()
        return min(1.0, (self.later_stood + LATER_PRIOR) / (self.later_promised + LATER_PRIOR))

    def new_request(self) -> None:
        """`later` starts again (the rates by length are kept): how a fresh question's
        drafts fared is no verdict on a regenerate's."""
        self.later_stood = self.later_promised = 0.0

    def age(self, tokens: int) -> None:
        """`tokens` were decoded (applied at the next read: a step costs a count)."""
        self._unaged += tokens

    def rate(self, length: int) -> float:
        """The posterior mean that a token continuing a match of `length` is right."""
        if length < 1:
            raise ValueError("a drafted token continues a match of one token at least")
        self._settle()
        at = min(length, LONGEST)
        return float((self.accepted[at] + _PRIORS[at]) / (self.trials[at] + PRIOR_TRIALS))

    def confidence(self, length: int, tokens: int) -> list[float]:
        """P(the draft's first j tokens all stand), for j = 1..tokens: `rate` of each
        token's length less `DOUBT` deviations (not below 0), multiplied in order, each
        after the first times `later`. Asked on every match, most of which the cut then
        drops: plain floats over the few lengths (on a CPU a 16-token draft's took ~16 us
        through `rate` and NumPy, a step's bookkeeping most of that)."""
        if tokens and length < 1:
            raise ValueError("a drafted token continues a match of one token at least")
        later = self.later  # settles the evidence
        accepted, trials = self.accepted.tolist(), self.trials.tolist()
        out, p = [], 1.0
        for j in range(tokens):
            at = min(length + j, LONGEST)
            n = trials[at] + PRIOR_TRIALS
            m = (accepted[at] + _PRIORS[at]) / n
            m = max(0.0, m - DOUBT * (m * (1.0 - m) / (n + 1.0)) ** 0.5)  # the Beta's sd
            p *= m * (later if j else 1.0)
            out.append(p)
        return out

    def judge(self, length: int, drafted: int, accepted: int, verified: bool = True) -> None:
        """A verdict on a draft from a match of `length`: its first `accepted` tokens stood
        and, if fewer than `drafted`, the next one was rejected (the rows after it were not
        judged). `verified`: a verify's, on a draft its confidence chose (else a dropped
        proposal's first token, judged by the token that came: no part of `later`)."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted {accepted} of {drafted} drafted")
        self._settle()
        for j in range(min(drafted, accepted + 1)):
            at, stood = min(length + j, LONGEST), 1.0 if j < accepted else 0.0
            if verified and j:  # a later token: its rate as promised, before this verdict
                promised = self.rate(at)
                self.later_stood = LATER_DECAY * self.later_stood + stood
                self.later_promised = LATER_DECAY * self.later_promised + promised
            self.accepted[at] = DECAY * self.accepted[at] + stood
            self.trials[at] = DECAY * self.trials[at] + 1.0

    def _settle(self) -> None:
        if self._unaged:
            keep = AGE**self._unaged
            self.accepted *= keep
            self.trials *= keep
            self.later_stood *= keep
            self.later_promised *= keep
            self._unaged = 0
