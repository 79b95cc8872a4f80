"""The reference every state test compares with: a fresh prefill of the same tokens.

float32 states (and MLX in float32): the next logits within TOLERANCE. float16 K/V (the
NumPy backend's default): the next logits within float16's bound and every K/V row the
state holds within the row bound of the fresh state's row for that position
(tests/tolerances.py), since float32 noise crossing a rounding boundary moves the next
logits as far as one wrong row does at a long context.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.sequence import SequenceState
from engine.state import SnapshotPolicy
from tests.tiny_models import VOCAB_SIZE
from tests.tolerances import as_f64, assert_logits_close, assert_rows_close, compute_dtype, host

TOLERANCE = 1e-4  # max abs diff on float32 logits of magnitude ~10


def token_ids(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB_SIZE, n)]


def rows(logits: Any) -> np.ndarray:
    """Logits of any backend as float64 [rows, vocab]."""
    return as_f64(logits).reshape(-1, VOCAB_SIZE)


def fresh_next_logits(model: Any, policy: SnapshotPolicy, tokens: list[int]) -> np.ndarray:
    """The reference: one forward of `tokens` on a new state."""
    return fresh_prefill(model, policy, tokens)[1]


def fresh_prefill(
    model: Any, policy: SnapshotPolicy, tokens: list[int]
) -> tuple[SequenceState, np.ndarray]:
    """A new state after one forward of `tokens`, and its last logits."""
    state = model.new_state(policy)
    return state, rows(model.forward(tokens, state, logits="last"))[-1]


def probe_next_logits(model: Any, state: SequenceState, probe: int) -> np.ndarray:
    """The state's logits after one more token, taken inside a checkpoint and rolled back."""
    cp = state.checkpoint()
    logits = rows(model.forward([probe], state, logits="last"))[-1]
    state.rollback(cp)
    return logits


def assert_close(model: Any, got: np.ndarray, want: np.ndarray, what: str) -> None:
    """float32: max abs diff <= TOLERANCE; float16 K/V: float16's bound (tests/tolerances.py)."""
    dtype = compute_dtype(model.ops)
    if dtype == "float32":
        diff = float(np.abs(got - want).max())
        assert diff <= TOLERANCE, f"{what}: max abs diff {diff:.3g} against a fresh prefill"
    else:
        assert_logits_close(got, want, dtype, model.config.hidden_size, f"{what}:")


def assert_rows_match(model: Any, state: SequenceState, fresh: SequenceState) -> None:
    """Every K/V row `state` holds for a position below its length within the row bound of
    the same position's row in `fresh` (a fresh prefill of at least its tokens). A ring
    must also hold every row its next query reads (the last `window - 1` positions)."""
    n, dtype, reduction = state.offset, compute_dtype(model.ops), model.config.hidden_size
    if n == 0:
        return
    for i, (layer, ref) in enumerate(zip(state.layers, fresh.layers, strict=True)):
        got, want = layer.arrays(), ref.arrays()
        if "k" not in got:  # a recurrent layer (its logits tell), or no rows yet
            continue
        if "pos" in got:  # a ring: the slots holding the same position in both
            pos, ref_pos = host(got["pos"]), host(want["pos"])
            needed = set(range(max(0, n + 1 - layer.window), n))  # type: ignore[attr-defined]
            assert needed <= set(pos.tolist()), f"layer {i}: the ring lacks rows it needs"
            slots = (pos == ref_pos) & (pos >= 0) & (pos < n)
            pairs = [(host(got[key])[:, slots], host(want[key])[:, slots]) for key in "kv"]
        else:
            pairs = [(host(got[key]), host(want[key])[:, :n]) for key in "kv"]
        for key, (a, b) in zip("kv", pairs, strict=True):
            assert_rows_close(a, b, dtype, reduction, 1, f"layer {i} {key} rows:")


def assert_next_logits_exact(model: Any, state: SequenceState, probe: int = 7) -> None:
    tokens = list(state.tokens)
    got = probe_next_logits(model, state, probe)
    assert state.tokens == tokens
    fresh, want = fresh_prefill(model, state.policy, [*tokens, probe])
    assert_close(model, got, want, "next logits")
    assert_rows_match(model, state, fresh)


def assert_last_logits_exact(model: Any, state: SequenceState, logits: Any, what: str) -> None:
    """`logits`, the last row a forward on `state` gave, against a fresh prefill of the
    state's tokens; its K/V rows too."""
    fresh, want = fresh_prefill(model, state.policy, list(state.tokens))
    assert_close(model, rows(logits)[-1], want, what)
    assert_rows_match(model, state, fresh)
