"""The host's draw of a sampled step from the likeliest tokens alone, where that gives the
token `sampling.sample` gives from the whole row.

On a GPU the host's part of a queued sampled step was most of the step: the copy of the
49,152 float32 logits off the device and float64 exponentials over all of them, ~1.5 ms
of host work a token on an H100 where the kernel takes 0.75 ms (docs/BENCHMARKS.md). A
nucleus (top-p) draw reads the likeliest tokens' weights and the total weight alone. So
the device packs its K likeliest logits, their ids, and the float32 weight of all the
others (engine/device_sampling.py's `pack`, evaluated with the step), and `decide` draws
from that whenever the float32 weight's error bound cannot change the nucleus. Otherwise
(a tie at the pack's edge or at the nucleus's cut, a cut the bound leaves open, a
nucleus of more than K tokens, a value that is not finite) it returns None and the
caller draws from the whole row. Where it decides, the token is `sampling.sample`'s:

- the candidates' weights are the same float64 operations on the same values (a float32
  logit is exact in float64, and the row's largest logit is among them);
- the nucleus's running sums add the same values in the same order (tied values only
  swap places with equal ones), and the total, the one figure not summed as the
  reference sums it, lies in an interval on which every comparison that sets the cut
  comes out the same (correctly rounded division is monotone in the divisor);
- the draw runs over the same kept weights in ascending id order.
"""

from __future__ import annotations

import numpy as np

from engine import sampling
from engine.sampling import SamplingSettings

K = 256  # the likeliest tokens the device packs (a nucleus of top-p 0.95 holds a few dozen)
# The float32 weight of the other tokens against its float64 value. Relative: the
# summation's n * 2^-24 (any order of adding n terms), each term's exponent argument
# (x / T - max in float32: three roundings of values up to |max / T| + 40, past which a
# term is below 2^-57 of the largest), and exp's own error there (CUDA's fast exp: ~50
# ulp at |arg| 40). Absolute: terms that underflow in float32 and not in float64.
EXP_ERROR = 2e-5
UNDERFLOW = 1e-20
# the total's float64 rounding in another summation order: n * 2^-53 for n up to 2^24
REORDER = 2e-9


def can_decide(s: SamplingSettings) -> bool:
    """Whether the packed candidates can give this reply's draws: a nucleus (top-p) draw
    after temperature alone (top-k, min-p and a repetition penalty read the whole row)."""
    return (
        not s.is_greedy
        and s.top_p < 1.0
        and s.top_k == 0
        and s.min_p == 0.0
        and s.repetition_penalty == 1.0
    )


def decide(packed: np.ndarray, s: SamplingSettings, u: float) -> int | None:
    """The token `sampling.sample` draws at uniform `u` from the row `packed` was made
    of, or None where the pack cannot tell. `packed` [2k + 3] float32: k logits, their
    token ids, the float32 weight exp((x - max) / T) of the row's other tokens, how many
    logits of the row are >= the least of the k, and the row's size."""
    k = (packed.size - 3) // 2
    if not np.all(np.isfinite(packed)) or int(packed[2 * k + 1]) != k:
        return None  # not finite, or a tie with a token left out at the pack's edge
    vocab = int(packed[2 * k + 2])
    ids = packed[k : 2 * k].astype(np.int64)
    x = packed[:k].astype(np.float64) / s.temperature
    x -= x.max()
    p = np.exp(x)
    order = np.argsort(-p, kind="stable")
    ordered = p[order]
    cum = np.cumsum(ordered)
    rest = float(packed[2 * k])
    argument = 4 * (float(np.abs(packed[:k]).max()) / s.temperature + 40) * 2.0**-24
    spread = rest * (vocab * 2.0**-24 + argument + EXP_ERROR) + UNDERFLOW
    kept_weight = float(p.sum())
    low = (kept_weight + max(rest - spread, 0.0)) * (1 - REORDER)
    high = (kept_weight + rest + spread) * (1 + REORDER)
    # the larger the total, the later the running sum reaches top_p: the cut at `high` is
    # the latest the reference's total allows, at `low` the earliest
    cut = int(np.searchsorted(cum / high, s.top_p)) + 1
    if cut > k or cut != int(np.searchsorted(cum / low, s.top_p)) + 1:
        return None  # past the pack, or the bound leaves the cut open
    if cut < k and ordered[cut - 1] == ordered[cut]:
        return None  # a tie at the cut: which of them is kept is the sort's choice
    kept = order[:cut][np.argsort(ids[order[:cut]])]  # ascending token ids
    return int(ids[kept][sampling.draw(p[kept], u)])
