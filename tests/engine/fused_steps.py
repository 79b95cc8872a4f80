"""What the one-launch step's family tests share (tests/engine/test_fused_hybrid.py,
test_fused_gemma3.py): single steps after a prompt, a step's logits against the plain
forward's in float32, and a verify kept in part continuing as single steps would."""

from __future__ import annotations

from typing import Any

import numpy as np


def single_steps(lm: Any, steps: list[int], prompt: list[int]) -> tuple[list[np.ndarray], Any]:
    """The logits of each of `steps` decoded one at a time after `prompt`, and the state."""
    state = lm.runner.new_state()
    lm.runner.forward(prompt, state)
    return [np.array(lm.ops.to_numpy(lm.runner.forward([t], state))) for t in steps], state


def assert_close_to_plain(plain: list[np.ndarray], step: list[np.ndarray]) -> None:
    """float32 logits of two summation orders: within 2e-4 of the largest."""
    for a, b in zip(plain, step, strict=True):
        np.testing.assert_allclose(b, a, atol=2e-4 * max(1.0, float(np.abs(a).max())), rtol=0)


def assert_kept_verify_continues(
    lm: Any, prompt: list[int], draft: list[int], after: list[int], kept: int
) -> None:
    """A verify of `draft` after `prompt`, its first `kept` rows kept (rollback_retaining),
    then `after` decoded one at a time: the logits of single steps over the same tokens,
    bit for bit, all through the step."""
    runner = lm.runner
    single, _ = single_steps(lm, draft[:kept] + after, prompt)
    state = runner.new_state()
    runner.forward(prompt, state)
    cp = state.checkpoint(record=True)
    runner.forward(draft, state, logits="all")
    state.rollback_retaining(cp, kept)
    assert state.offset == len(prompt) + kept
    again = [np.array(lm.ops.to_numpy(runner.forward([t], state))) for t in after]
    assert runner.last_path == "fused"
    for a, b in zip(single[kept:], again, strict=True):
        np.testing.assert_array_equal(b, a)
