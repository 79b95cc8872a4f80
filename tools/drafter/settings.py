"""The training run's settings (everything that shapes its trajectory), the drafter's
shape from them, and which eval_chat result is the best."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tools.drafter.model import DrafterConfig


@dataclass(frozen=True)
class Settings:
    """Everything that shapes the run's trajectory; a resumed run keeps the saved ones."""

    layers: int = 2
    intermediate: int = 1536
    block: int = 16
    vocab_size: int = 8192
    batch: int = 32  # sequences per step
    anchors: int = 32  # blocks per sequence
    max_len: int = 768
    steps: int = 3000  # the schedule's length
    lr: float = 6e-4
    warmup: int = 100
    weight_decay: float = 0.01
    clip: float = 1.0
    decay_gamma: float = 7.0  # 0: every row weighs the same
    heldout_fraction: float = 0.02
    seed: int = 0
    distill: float = 1.0  # weight of the KL to the target's distribution; 0: hard labels
    distill_temperature: float = 1.0
    # a drafter file (format 1) the run starts from instead of random weights: its shape
    # and its draft vocabulary are kept (a warm start on more data, not a new drafter)
    init: str = ""
    # the target layers whose outputs make a context row, comma-separated and rising,
    # the last layer last (the distillation reads its rows there); "": the last alone
    taps: str = ""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.anchors < 1 or self.warmup < 0:
            raise ValueError(f"steps, batch and anchors must be positive: {self}")
        if not 0 <= self.heldout_fraction < 1:
            raise ValueError(f"heldout_fraction {self.heldout_fraction} is not in [0, 1)")
        if not 0 <= self.distill <= 1 or self.distill_temperature <= 0:
            raise ValueError(f"distill must be in [0, 1], its temperature positive: {self}")
        if self.taps and not all(t.strip().isdigit() for t in self.taps.split(",")):
            raise ValueError(f"taps {self.taps!r}: layer numbers, comma-separated")

    def target_layers(self, num_layers: int) -> tuple[int, ...]:
        """The tapped layers of a target of `num_layers`: () for the last alone."""
        if not self.taps:
            return ()
        layers = tuple(int(t) for t in self.taps.split(","))
        if list(layers) != sorted(set(layers)) or layers[-1] != num_layers - 1:
            raise ValueError(
                f"taps {self.taps!r}: rising layer numbers ending at the last, {num_layers - 1}"
            )
        return layers

    def lr_at(self, step: int) -> float:
        warm = min(1.0, (step + 1) / self.warmup) if self.warmup else 1.0
        progress = min(1.0, step / self.steps)
        return self.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def drafter_config(target: dict, s: Settings, vocab_size: int) -> DrafterConfig:
    """The drafter's shape: attention and numerics from the target, the rest from `s`."""
    return DrafterConfig(
        hidden=target["hidden_size"],
        num_layers=s.layers,
        num_heads=target["num_attention_heads"],
        num_kv_heads=target["num_key_value_heads"],
        head_dim=target["head_dim"],
        intermediate=s.intermediate,
        block=s.block,
        rope_base=target["rope_theta"],
        rms_eps=target["rms_norm_eps"],
        vocab_size=vocab_size,
        target_layers=s.target_layers(target["num_hidden_layers"]),
    )


# settings a checkpoint from before they existed was trained with
LEGACY_SETTINGS = {"distill": 0.0, "distill_temperature": 1.0, "taps": ""}


def better(score: dict, best: dict | None) -> bool:
    """Whether an eval_chat result beats the best so far: mean acceptance length, then
    row-1 accuracy; a tie keeps the earlier checkpoint."""
    if best is None:
        return True
    return (score["acceptance"], score["acc"][0]) > (best["acceptance"], best["acc"][0])
