"""The model interface the session, the decode loop and the drafters are written against.

`engine.models.base.DecoderModel` has it (the plain forward) and so does
`engine.runner.ModelRunner` (which picks the fused or the plain path for each call).
"""

from __future__ import annotations

from typing import Protocol

from engine.models.base import ModelConfig
from engine.sequence import SequenceState
from engine.state import SnapshotPolicy
from kernels.ops import Array, Ops


class Model(Protocol):
    @property
    def ops(self) -> Ops: ...

    @property
    def config(self) -> ModelConfig: ...

    def new_state(self, policy: SnapshotPolicy | None = None) -> SequenceState:
        """An empty sequence state with one layer state per layer."""

    def forward(self, token_ids: list[int], state: SequenceState, logits: str = "last") -> Array:
        """Append `token_ids` to `state`; logits for "all" rows, the "last" row, or "none"."""

    def forward_hidden(
        self,
        token_ids: list[int],
        state: SequenceState,
        logits: str = "last",
        taps: tuple[int, ...] = (),
    ) -> tuple[Array, Array]:
        """`forward`, and the last decoder layer's output rows [L, D] (before the norm);
        with `taps`, those layers' outputs side by side [L, len(taps) * D]."""
