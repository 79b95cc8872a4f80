"""A draw of the next token on the device, so a sampled step can be queued before the host
has drawn the token it takes (engine/runner/ahead.py, decoding._plain_run).

It follows engine/sampling.py's transforms in their order (temperature, top-k, min-p,
top-p, then the inverse CDF at the position's uniform) in float32 on MLX. The host still
draws every token, in float64, from the row's logits, and a queued step whose input was
not the host's token is undone and launched again: so this draw only has to agree with
the host's nearly always. It differs where the uniform falls within float32's rounding
of a boundary of the CDF or the nucleus, or the nucleus cut meets a tie. A repetition
penalty has no device form here: such replies are not queued.

For a nucleus draw the device also packs what the host's draw reads in place of the row
(`pack`: the likeliest logits, their ids, the others' weight; engine/sampling_candidates.py).
On CUDA the pack and the draw from it are one kernel (kernels/nucleus_pack_cuda.py), the
MLX operations here the form on every other device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache, partial

import mlx.core as mx
import numpy as np

from engine import sampling_candidates
from engine.runner.ahead import DeviceDraw
from engine.sampling import SamplingSettings
from kernels import nucleus_pack_cuda

# Packs and draws on CUDA in one kernel; tools/gpu/nucleus_round.sh sets it False to time
# MLX's operations beside it
PACK_KERNEL = True


# the nucleus draw `warm_up` makes: on CUDA one build of the pack-and-draw kernel serves
# every setting (they are the kernel's inputs, not its template)
WARM_UP_SETTINGS = SamplingSettings(temperature=1.0, top_p=0.95)


def warm_up(row: mx.array) -> int:
    """A nucleus draw from a logits row [V] (or [1, V]), evaluated, so that a first sampled
    reply finds its kernel built; the token drawn."""
    token, packed = draw(WARM_UP_SETTINGS, 0.5)(row.reshape(-1).astype(mx.float32))
    mx.eval(token, *([] if packed is None else [packed]))
    return int(np.array(token).reshape(-1)[0])


def can_draw(s: SamplingSettings) -> bool:
    """Whether `draw` follows these settings (a repetition penalty it does not)."""
    return not s.is_greedy and s.repetition_penalty == 1.0


def draw(s: SamplingSettings, u: float) -> DeviceDraw:
    """The device's token at uniform `u` as [1] uint32: for a nucleus draw from the pack
    the host's draw reads (`pack`: a sort of its k tokens, not of the vocabulary), else
    from the float32 logits row [V]."""
    if not can_draw(s):
        raise ValueError("the device draw takes sampled settings without a repetition penalty")
    if sampling_candidates.can_decide(s):
        return DeviceDraw(partial(_nucleus, s.temperature, s.top_p, u))
    at = mx.array(u, dtype=mx.float32)  # as `u` meets float32 arrays in the graph
    traced = _traced(_graph_settings(s))
    return DeviceDraw(lambda row: (traced(row, at), None))


def _nucleus(
    temperature: float, top_p: float, u: float, row: mx.array
) -> tuple[mx.array, mx.array]:
    """(the token [1], the pack) of a logits row [V] float32: one kernel on CUDA
    (kernels/nucleus_pack_cuda.py), else MLX operations."""
    V = int(row.shape[0])
    if _kernel_packs(V):
        packed, token = nucleus_pack_cuda.pack_and_draw(
            row.reshape(1, V), sampling_candidates.K, temperature, top_p, u
        )
        return token, packed.reshape(-1)
    packed = _packed(temperature)(row)
    return _traced_among(temperature, top_p)(packed, mx.array(u, dtype=mx.float32)), packed


def _kernel_packs(vocab: int) -> bool:
    return PACK_KERNEL and vocab > sampling_candidates.K and nucleus_pack_cuda.is_available()


@lru_cache(maxsize=8)
def _traced_among(temperature: float, top_p: float) -> Callable[[mx.array, mx.array], mx.array]:
    return mx.compile(lambda packed, u: _token_among(packed, u, temperature, top_p))


def _token_among(packed: mx.array, u: mx.array, temperature: float, top_p: float) -> mx.array:
    """The nucleus draw of `_next_token` from a pack [2k + 3]: its k likeliest tokens and
    the others' weight (in the total the nucleus is measured against), in float32."""
    k = (int(packed.shape[0]) - 3) // 2
    x = packed[:k] / temperature
    p = mx.exp(x - x.max())
    ordered = mx.sort(p)[::-1]
    cum = mx.cumsum(ordered) / (p.sum() + packed[2 * k])
    last = mx.minimum(mx.sum(cum < top_p), k - 1)
    kept = mx.where(p < ordered[last], 0.0, p)
    by_id = mx.argsort(packed[k : 2 * k])  # the draw runs in ascending token ids
    cdf = mx.cumsum(kept[by_id])
    at = mx.argmax(cdf > u * cdf[-1])
    return packed[k : 2 * k][by_id[at]].astype(mx.uint32).reshape(1)


@lru_cache(maxsize=8)
def _packed(temperature: float) -> Callable[[mx.array], mx.array]:
    return mx.compile(lambda rows: pack(rows, temperature))


class PackedRows:
    """Logits rows [n, V] left on the device with each row's pack on the host (`packs`):
    a row itself is copied only where its pack cannot tell (`row`)."""

    def __init__(self, logits: mx.array, temperature: float) -> None:
        self.logits = logits
        rows = logits if logits.dtype == mx.float32 else logits.astype(mx.float32)
        if _kernel_packs(int(rows.shape[1])):
            # its draws go unread: a verify's tokens are the host's
            packs, _ = nucleus_pack_cuda.pack_and_draw(
                rows, sampling_candidates.K, temperature, 1.0, 0.0
            )
        else:
            packs = _packed(temperature)(rows)
        self.packs = np.asarray(packs)

    def row(self, i: int) -> np.ndarray:
        """Row i as the host's float32 rows hold it (`ops.to_numpy`'s)."""
        return np.array(self.logits[i].astype(mx.float32), dtype=np.float32)


def pack(rows: mx.array, temperature: float) -> mx.array:
    """[2k + 3] float32 from a logits row [V] float32 ([n, 2k + 3] from rows [n, V]): its
    k = min(K, V) largest logits, their ids (exact in float32 below 2^24), the float32
    weight exp((x - max) / T) of the other tokens, how many logits are >= the least of
    the k (k but for a tie), and V."""
    one = rows.ndim == 1
    rows = rows[None] if one else rows
    n, V = int(rows.shape[0]), int(rows.shape[1])
    if V >= 1 << 24:
        raise ValueError("token ids past 2^24 are not exact in a float32 pack")
    k = min(sampling_candidates.K, V)
    if k < V:
        ids = mx.argpartition(-rows, k - 1, axis=-1)[:, :k]
    else:
        ids = mx.broadcast_to(mx.arange(V), (n, V))
    top = mx.take_along_axis(rows, ids, axis=-1)
    least = top.min(axis=-1, keepdims=True)
    x = rows / temperature
    weight = mx.exp(x - x.max(axis=-1, keepdims=True))
    rest = mx.where(rows < least, weight, 0.0).sum(axis=-1, keepdims=True)
    count = (rows >= least).sum(axis=-1, keepdims=True).astype(mx.float32)
    size = mx.full((n, 1), V, dtype=mx.float32)
    out = mx.concatenate([top, ids.astype(mx.float32), rest, count, size], axis=-1)
    return out[0] if one else out


def _graph_settings(s: SamplingSettings) -> SamplingSettings:
    """The settings the graph is made of: one trace serves every seed."""
    return replace(s, seed=None)


@lru_cache(maxsize=8)
def _traced(s: SamplingSettings) -> Callable[[mx.array, mx.array], mx.array]:
    """`_next_token` for these settings, traced once (`mx.compile`): a step's host work
    is then a replay of the graph, its elementwise chains fused, where building ~20 small
    operations a step cost the H100's host ~0.3 ms of a ~2 ms sampled step."""
    return mx.compile(lambda row, u: _next_token(s, row, u))


def _next_token(s: SamplingSettings, row: mx.array, u: mx.array) -> mx.array:
    x = row / s.temperature
    p = mx.exp(x - x.max())
    V = p.shape[0]
    if s.top_k and s.top_k < V:
        kth = mx.sort(p)[V - s.top_k]
        p = mx.where(p < kth, 0.0, p)
    if s.min_p > 0:
        p = mx.where(p < s.min_p * p.max(), 0.0, p)
    if s.top_p < 1.0:
        ordered = mx.sort(p)[::-1]  # descending
        cum = mx.cumsum(ordered) / ordered.sum()
        # the smallest prefix reaching top_p ends at the first cum >= top_p
        last = mx.minimum(mx.sum(cum < s.top_p), V - 1)
        p = mx.where(p < ordered[last], 0.0, p)
    cdf = mx.cumsum(p)
    token = mx.argmax(cdf > u * cdf[-1])  # the first index past u of the mass
    return token.reshape(1)
