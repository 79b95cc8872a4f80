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

The lengths also share one scale: every verdict, at whatever length, weighs the tokens that
stood against what the fixed priors expected of them, and each length's prior mean is
`prior_rate(L)` times that ratio (at most `RATE_CAP`). A length with no verdicts of its own
then starts from what this text's matches have been worth, not from the CPU's workloads:
on an H100 a fresh chat on the Llama-3.2-1B shape's text took 23 verifies in 128 tokens
(43% of the drafted tokens stood), spread over a dozen lengths, each too few to move its
prior, and Auto ran at 0.83x plain decoding (docs/BENCHMARKS.md, session 36).
"""

from __future__ import annotations

import numpy as np

LONGEST = 16  # matches longer than this are judged with it
PRIOR_TRIALS = 2.0  # the prior's weight, in verdicts
DECAY = 0.98  # per verdict at a length (and per token pooled): the latest ~50 of them count
AGE = 0.997  # per token decoded: 230 tokens halve every length's evidence
SCALE_PRIOR = 4.0  # the shared scale's prior weight, in expected tokens (1 before verdicts)
RATE_CAP = 0.95  # the most a scaled prior mean may be


def prior_rate(length: int) -> float:
    """Before any verdict: (L - 1) / (L + 1): a third for the shortest match lookup drafts
    from by default (two tokens), 0.6 from four, 0.88 from sixteen, near what the CPU's
    workloads measured. From one token: 0, so such a draft is always dropped (a lookup
    with min_match 1 drafts from two tokens on)."""
    return (length - 1.0) / (length + 1.0)


_RATES = [prior_rate(length) for length in range(LONGEST + 1)]


class MatchAcceptance:
    def __init__(self) -> None:
        self.accepted = np.zeros(LONGEST + 1)  # aged verdicts, by match length
        self.trials = np.zeros(LONGEST + 1)
        # every length's verdicts pooled (aged alike): the tokens that stood, and the sum of
        # the fixed priors' rates at their lengths (what those priors expected of them)
        self.stood = 0.0
        self.expected = 0.0
        self._priors = [PRIOR_TRIALS * r for r in _RATES]  # the prior's accepted, scaled
        self._unaged = 0  # tokens decoded since the evidence was last aged

    @property
    def scale(self) -> float:
        """What this text's matches have been worth against the fixed priors: the tokens
        that stood over the tokens the priors expected to (1 before any verdict)."""
        self._settle()
        return (self.stood + SCALE_PRIOR) / (self.expected + SCALE_PRIOR)

    def age(self, tokens: int) -> None:
        """`tokens` were decoded (applied at the next read: a step costs a count)."""
        self._unaged += tokens

    def rate(self, length: int) -> float:
        """The posterior mean that a token continuing a match of `length` is right."""
        if length < 1:
            raise ValueError("a drafted token continues a match of one token at least")
        self._settle()
        at = min(length, LONGEST)
        return float((self.accepted[at] + self._priors[at]) / (self.trials[at] + PRIOR_TRIALS))

    def confidence(self, length: int, tokens: int) -> list[float]:
        """P(the draft's first j tokens all stand), for j = 1..tokens: `rate` of each
        token's length, multiplied in order. Asked on every match, most of which the cut
        then drops: plain floats over the few lengths (on a CPU a 16-token draft's took
        ~16 us through `rate` and NumPy, a step's bookkeeping most of that)."""
        if tokens and length < 1:
            raise ValueError("a drafted token continues a match of one token at least")
        self._settle()
        accepted, trials, priors = self.accepted.tolist(), self.trials.tolist(), self._priors
        out, p = [], 1.0
        for j in range(tokens):
            at = min(length + j, LONGEST)
            p *= (accepted[at] + priors[at]) / (trials[at] + PRIOR_TRIALS)
            out.append(p)
        return out

    def judge(self, length: int, drafted: int, accepted: int) -> None:
        """A verify's verdict on a draft from a match of `length`: its first `accepted`
        tokens stood and, if fewer than `drafted`, the next one was rejected (the rows
        after it were not judged)."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted {accepted} of {drafted} drafted")
        self._settle()
        for j in range(min(drafted, accepted + 1)):
            at, stood = min(length + j, LONGEST), 1.0 if j < accepted else 0.0
            self.accepted[at] = DECAY * self.accepted[at] + stood
            self.trials[at] = DECAY * self.trials[at] + 1.0
            self.stood = DECAY * self.stood + stood
            self.expected = DECAY * self.expected + _RATES[at]
        self._rescale()

    def _rescale(self) -> None:
        scale = (self.stood + SCALE_PRIOR) / (self.expected + SCALE_PRIOR)
        self._priors = [PRIOR_TRIALS * min(RATE_CAP, r * scale) for r in _RATES]

    def _settle(self) -> None:
        if self._unaged:
            keep = AGE**self._unaged
            self.accepted *= keep
            self.trials *= keep
            self.stood *= keep
            self.expected *= keep
            self._unaged = 0
            self._rescale()
