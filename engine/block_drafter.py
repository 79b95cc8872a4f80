"""The block drafter: a whole block of draft tokens from one pass of a small model whose
context is the target's own hidden states (DFlash-style; docs/DESIGN.md, "The block
drafter", gives the architecture and the file format).

Two facts organise the state kept here:

1. **Its context rows come from the target.** For every committed position t the decode
   loop hands over the target's last-layer output h_t, or the outputs of the layers its
   file taps side by side (`observe_hidden`); the drafter
   fuses it (`fc`, a norm) and projects it with each layer's own k/v projections into a
   per-layer cache. The drafter never runs its layers over the context: a draft pass is
   only the block's query rows (the pending token, then mask rows).
2. **The cursor counts target-derived rows only.** Rows cover positions [base, cursor)
   of `tokens`, the committed context. A draft's own rows are never stored: a pass
   concatenates them to the context for its attention and drops them, so nothing a draft
   wrote can be read as context later. `propose` checks that every committed token has
   its row (cursor == len(tokens)) and fails loudly rather than draft from stale rows.
   Rows are queued as they come and projected in one pass when a draft needs them, so a
   plain step costs the drafter nothing while the cost model keeps k at 0.

Causal attention inside the block makes the first k + 1 rows of a pass exactly what the
full block gives those rows, so any k <= block - 1 drafts the same tokens.

Rows are rotated at their slot in the cache, position - base, and the block after them
at its slots. Under RoPE a query's score against a key depends only on the difference of
their positions, so a context that starts at position 37 (the target's prefix was
reused but the drafter never saw it) drafts as if its positions were the slots, up to
rounding; and every pass, the fused kernel's included, takes a position that is also its
cache row.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from engine.block_pass_cpu import CpuPass
from engine.block_pass_fused import FusedPass, PassTimedOut
from engine.block_pass_mlx import CompiledPass
from engine.drafter_file import BlockDrafterWeights
from engine.drafters import Draft, Sampler
from engine.errors import StateError
from engine.kv_state import FullKV
from engine.models.base import DecoderModel
from engine.sequence import SequenceState
from kernels.ops import Array, CausalMask, Ops

log = logging.getLogger(__name__)

QUEUE_ROWS = 256  # queued target rows projected at once when no draft asked for them


class BlockDrafter:
    """The Drafter protocol (engine/drafters.py) with the hidden-state extension: the
    decode loop calls `observe_hidden(rows)` with the target's rows of the tokens the
    next `commit` adds, and the prompt's rows after `begin`."""

    wants_hidden = True
    drafts_in_one_pass = True  # a pass costs about the same for any k (the cost model)

    def __init__(
        self,
        weights: BlockDrafterWeights,
        target: DecoderModel,
        compiled: bool | CompiledPass = False,
        cpu_pass: CpuPass | None = None,
        fused: FusedPass | None = None,
    ) -> None:
        """`compiled`: on MLX, the pass traced once (engine/block_pass_mlx.py); a
        CompiledPass: that one, shared with other sessions' drafters of these weights.
        `cpu_pass`: on NumPy, the pass as one C call (engine/block_pass_cpu.py). `fused`:
        on CUDA, the pass as one launch of the step kernel (engine/block_pass_fused.py),
        the traced pass (else op by op) after a launch whose barrier timed out."""
        self.w, self.target = weights, target
        self.cpu_pass = cpu_pass
        self.fused = fused
        self.taps = weights.shape.taps  # the target layers its rows are made of
        self.ops: Ops = target.ops
        self.compiled: CompiledPass | None = None
        if isinstance(compiled, CompiledPass):
            self.compiled = compiled
        elif compiled and self.ops.name == "mlx":
            self.compiled = CompiledPass(weights, self.ops)
        s = weights.shape
        self.tokens: list[int] = []  # the committed context
        self.base = 0  # first position with a row
        self.kv = [FullKV(self.ops, s.kv_heads, s.head_dim) for _ in range(s.layers)]
        # rows after the computed ones, projected into the context only when a draft needs
        # them: a plain step costs the drafter nothing while the cost model keeps k at 0
        self._queued: list[Array] = []
        self._queued_rows = 0
        self._sample: Sampler | None = None
        self._by_id = np.argsort(weights.vocab)  # the draft vocabulary in token-id order
        self._ids = weights.vocab[self._by_id]

    @property
    def cursor(self) -> int:
        """The position after the last target-derived row (computed or queued)."""
        return self.base + self.kv[0].length + self._queued_rows

    def nbytes(self) -> int:
        """The context's K/V rows and the queued target rows (engine/memory.py)."""
        queued = sum(int(self.ops.nbytes(rows)) for rows in self._queued)
        return sum(kv.nbytes() for kv in self.kv) + queued

    @property
    def max_draft(self) -> int:
        return self.w.shape.block - 1

    def couple(self, sample: Sampler | None) -> None:
        """Draw drafts with the request's sampler (None: greedy) until the request ends."""
        self._sample = sample

    # -- the context --------------------------------------------------------------------
    def begin(self, context: list[int]) -> None:
        """A new request over `context`: rows of the shared prefix stay; the prompt's new
        rows come next through `observe_hidden(rows, start)`."""
        self._sample = None
        lcp = 0
        for a, b in zip(self.tokens, context, strict=False):
            if a != b:
                break
            lcp += 1
        self.tokens = list(context)
        self._cut(min(lcp, self.cursor))

    def observe_hidden(self, rows: Any, start: int | None = None) -> None:
        """The target's rows [n, capture_width] (its last layer's, or its tapped layers'
        side by side) for positions start.. (None: the cursor).
        Rows re-sent for positions already held replace them with the same values; a gap
        after the cursor drops the older rows (the context then starts at `start`)."""
        rows = self.ops.asarray(rows)
        if int(rows.shape[-1]) != self.w.shape.capture_width:
            raise StateError(
                f"the block drafter takes rows of {self.w.shape.capture_width} (target layers "
                f"{self.taps or 'the last'}), not {int(rows.shape[-1])}"
            )
        n = int(rows.shape[0])
        start = self.cursor if start is None else start
        if start > self.cursor:
            self._reset(start)
        elif start < self.cursor:
            if start < self.base:  # rows before the context's start: keep from base on
                rows, n, start = rows[self.base - start :], n - (self.base - start), self.base
            self._cut(start)
        if n > 0:
            self._queued.append(rows)
            self._queued_rows += n
            if self._queued_rows >= QUEUE_ROWS:
                self._flush()

    def commit(self, tokens: list[int]) -> None:
        """`tokens` (the pending one first) joined the context; their rows came before."""
        self.tokens.extend(tokens)
        if self.cursor != len(self.tokens):
            raise StateError(
                f"the block drafter holds rows up to position {self.cursor} but the context "
                f"is {len(self.tokens)} tokens: a capture was missed or repeated"
            )

    def end(self) -> None:
        self._sample = None

    def _cut(self, position: int) -> None:
        self._flush()
        keep = max(0, position - self.base)
        for kv in self.kv:
            kv.length = min(kv.length, keep)

    def _reset(self, base: int) -> None:
        self._queued, self._queued_rows = [], 0
        self.base = base
        for kv in self.kv:
            kv.length = 0

    def _flush(self) -> None:
        """Context K/V of the queued rows, in one pass."""
        if not self._queued:
            return
        ops, s = self.ops, self.w.shape
        h = self._queued[0] if len(self._queued) == 1 else ops.concat(self._queued, axis=0)
        slot = self.kv[0].length  # its rotation (see the module text)
        self._queued, self._queued_rows = [], 0
        c = ops.rms_norm(ops.linear(h, self.w.fc), self.w.hidden_norm, s.eps)
        for layer, kv in zip(self.w.layers, self.kv, strict=True):
            k, v = self._split_kv(ops.linear(c, layer["kv_proj"]))
            kv.append(self._rope(k, slot), v)

    # -- drafting -----------------------------------------------------------------------
    def propose(self, pending: int, k: int) -> Draft:
        k = min(k, self.max_draft)
        if k <= 0:
            return Draft([])
        if self.cursor != len(self.tokens) or self.cursor == self.base:
            raise StateError(
                f"the block drafter's rows end at position {self.cursor}, its context at "
                f"{len(self.tokens)}: it would draft from stale rows"
            )
        if self._sample is None:  # a greedy draft reads each row's top token and its odds
            top, probability = self._top1(pending, k)
            return Draft([int(t) for t in self.w.vocab[top]], running_product(probability))
        rows = self._logit_rows(pending, k)  # one read of the rows
        sure = confidence(rows)
        drafted: list[int] = []
        history = [*self.tokens, pending]
        among = getattr(self._sample, "among", None)  # a draw over the draft vocabulary
        for row in rows:
            if among is not None:
                token = among(row[self._by_id], self._ids, history)
            else:  # q over the whole vocabulary: nothing outside the draft vocabulary
                full = np.full(self.target.config.vocab_size, -np.inf)
                full[self.w.vocab] = row
                token = self._sample(full, history)
            drafted.append(token)
            history.append(token)
        return Draft(drafted, sure)

    def _top1(self, pending: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows 1..k's top draft-vocabulary index and its probability."""
        one = self._one_launch("greedy", pending, k)
        if one is not None:
            top, probability = one
            return top[:k], probability[:k]
        if self.compiled is None:
            return self.ops.top1_rows(self._block(pending, k))
        top, probability = self.compiled.greedy(*self._pass_inputs(pending))
        return np.array(top)[:k], np.array(probability, dtype=np.float32)[:k]

    def _logit_rows(self, pending: int, k: int) -> np.ndarray:
        """Rows 1..k's draft-vocabulary logits [k, N], float64 on the host."""
        block = self._one_launch("logits", pending, k)
        if block is None:
            if self.compiled is None:
                block = self._block(pending, k)
            else:
                block = self.compiled.logits(*self._pass_inputs(pending))
        return np.asarray(self.ops.to_numpy(block), dtype=np.float64)[:k]

    def _one_launch(self, what: str, pending: int, k: int) -> Any:
        """The fused pass's `what` ("greedy" or "logits"), or None where there is none. A
        launch whose barrier timed out leaves it for the traced pass, for good."""
        if self.fused is None:
            return None
        self._flush()
        try:
            return getattr(self.fused, what)(pending, self.kv, k)
        except PassTimedOut:
            log.warning(
                "the block drafter's one-launch pass timed out at a grid barrier (not every "
                "block resident); its traced pass drafts from now on"
            )
            self.fused = None
            return None

    def _block(self, pending: int, k: int) -> Array:
        """Rows 1..k's draft-vocabulary logits [k, N]: one C call where the step runs the
        pass, else op by op."""
        if self.cpu_pass is None:
            return self.block_logits(pending, k)
        self._flush()
        x = np.concatenate([self._embedding(pending), *[self.w.mask_embedding] * k])
        return self.cpu_pass.logits(x, self.kv)[1:]

    def _pass_inputs(self, pending: int) -> tuple[Array, int, int, list[Array]]:
        self._flush()
        buffers = [b for kv in self.kv for b in (kv.keys, kv.values)]
        n = self.kv[0].length  # the block's rotation: its slot after the context's rows
        return self._embedding(pending), n, n, buffers

    def _embedding(self, pending: int) -> Array:
        x0 = self.ops.embed(self.target.embed, np.asarray([pending], dtype=np.int64))
        scale = self.target.config.embed_scale
        return x0 if scale == 1.0 else x0 * scale

    def block_logits(self, pending: int, k: int) -> Array:
        """Draft-vocabulary logits [k, N] of the block rows 1..k after `pending`, op by op."""
        self._flush()
        ops, s, w = self.ops, self.w.shape, self.w
        P, L = self.kv[0].length, k + 1  # rotated at its slot (see the module text)
        x = ops.concat(
            [self._embedding(pending), ops.concat([w.mask_embedding] * k, axis=0)], axis=0
        )
        n = self.kv[0].length
        # every context row, and causal inside the block: the causal mask of rows n..n+L-1
        # (MLX's fused causal form; no bool array to build and copy to the device)
        mask = CausalMask(n, L)
        for layer, kv in zip(w.layers, self.kv, strict=True):
            a = ops.rms_norm(x, layer["input_norm"], s.eps)
            q = self._rope(self._heads(ops.linear(a, layer["q_proj"]), s.heads), P)
            kb, vb = self._split_kv(ops.linear(a, layer["kv_proj"]))
            kb = self._rope(kb, P)
            keys = ops.concat([kv.keys[:, :n], kb.astype(kv.keys.dtype)], axis=1)
            values = ops.concat([kv.values[:, :n], vb.astype(kv.values.dtype)], axis=1)
            att = ops.attention(q, keys, values, s.head_dim**-0.5, mask)
            x = x + ops.linear(self._rows(att), layer["o_proj"])
            b = ops.rms_norm(x, layer["post_norm"], s.eps)
            gate_up = ops.linear(b, layer["gate_up"])
            F = s.intermediate
            x = x + ops.linear(ops.silu(gate_up[:, :F]) * gate_up[:, F:], layer["down_proj"])
        out = ops.linear(ops.rms_norm(x[1:], w.final_norm, s.eps), w.head)
        ops.evaluate(out)
        return out

    def _heads(self, x: Array, heads: int) -> Array:
        """[L, heads * Dh] -> [heads, L, Dh]"""
        L = int(x.shape[0])
        return x.reshape(L, heads, self.w.shape.head_dim).transpose(1, 0, 2)

    def _split_kv(self, kv: Array) -> tuple[Array, Array]:
        """[L, 2 * kv_heads * Dh] of the fused k|v product -> k, v as [kv_heads, L, Dh]."""
        width = self.w.shape.kv_heads * self.w.shape.head_dim
        heads = self.w.shape.kv_heads
        return self._heads(kv[:, :width], heads), self._heads(kv[:, width:], heads)

    def _rows(self, x: Array) -> Array:
        """[heads, L, Dh] -> [L, heads * Dh]"""
        H, L, Dh = (int(d) for d in x.shape)
        return x.transpose(1, 0, 2).reshape(L, H * Dh)

    def _rope(self, x: Array, offset: int) -> Array:
        s = self.w.shape
        return self.ops.rope(x, offset, s.head_dim, s.rope_base, False)


def running_product(top: np.ndarray) -> list[float]:
    """Given each row's top-1 probability, the running product: the drafter's estimate
    that rows 1..j are all accepted. On held-out chats the shipped drafter's estimate is a
    little under the observed rate at every level (docs/BENCHMARKS.md, "The block
    drafter"), so a cut by it errs toward fewer rows. It reads the rows' distributions
    alone, never the tokens drawn from them."""
    return [float(p) for p in np.cumprod(np.asarray(top, dtype=np.float64))]


def confidence(logits: np.ndarray) -> list[float]:
    """`running_product` of block logits [k, N]'s rows' top-1 probabilities."""
    z = logits - logits.max(axis=-1, keepdims=True)
    return running_product(1.0 / np.exp(z).sum(axis=-1))  # the top-1 term is exp(0) = 1


class CapturingForward:
    """A runner whose forwards also hand their last-layer rows (or those of the layers in
    `taps`, side by side) to `on_rows(start, rows)`: what a prefill is given when the
    request's drafter wants the prompt's rows."""

    def __init__(self, runner: Any, on_rows: Any, taps: tuple[int, ...] = ()) -> None:
        self.runner, self.on_rows, self.taps = runner, on_rows, taps

    def forward(self, token_ids: list[int], state: SequenceState, logits: str = "last") -> Any:
        start = state.offset
        out, rows = self.runner.forward_hidden(token_ids, state, logits, self.taps)
        self.on_rows(start, rows)
        return out

    def prefill_chunk(self, requested: int) -> int:
        return self.runner.prefill_chunk(requested)
