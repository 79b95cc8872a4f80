"""`ModelRunner`: a model together with the path its forward calls take.

A call of 1..16 rows on a model with the fused CUDA kernels enabled runs through them
(engine/runner/fused.py); on the NumPy backend a call of 1..64 rows (decode, verify, a
prefill piece) runs as one C call (engine/runner/cpu_step.py); every other call runs the
model's own forward. The runner
has the model's interface (`engine.models.protocol.Model`), so prefill, truncate, the
decode loop and the drafters take it where they take a model.
"""

from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx

from engine.config import EngineConfig, parse_step_tuning
from engine.models.base import DecoderModel, ModelConfig
from engine.runner import cpu_step, fused_hybrid
from engine.runner.ahead import DeviceDraw, Launch, Taps, launch_model
from engine.runner.cpu_step import CpuStep
from engine.runner.fused import (
    MAX_DENSE_BYTES,
    FusedDecode,
    dense_bytes,
    step_unsupported_reason,
    unsupported_reason,
)
from engine.sequence import SequenceState
from engine.state import SnapshotPolicy
from kernels import few_query_attention, fused_decode_cuda
from kernels.ops import Array, Ops
from kernels.step_knobs import TuningRefused

log = logging.getLogger(__name__)

# rows a prefill chunk carries where EngineConfig.prefill_chunk does not say: on a GPU a
# chunk is ~600 MLX ops of host work whatever its rows, and its products want wide rows
# (bench/gpu/prefill_probe.py); on a CPU the C step cuts a chunk into its 64-row pieces
PREFILL_ROWS = 256
GPU_PREFILL_ROWS = 2048
# Whether a hybrid (Gated DeltaNet layers) and Gemma 3 take the one-launch step unless
# told (EngineConfig.hybrid_step / gemma_step, BRANCHCHAT_HYBRID_STEP / _GEMMA_STEP=0 opt
# out): yes since session 16's H200 run of tests/engine/test_fused_hybrid.py and
# test_fused_gemma3.py (docs/h200/gpu-tests-20261203-s16.txt; the hybrid's decode 5x the
# plain MLX path's on the Qwen3.5-0.8B shape).
HYBRID_STEP = True
GEMMA_STEP = True
# the prompt `ModelRunner.warm_up` runs: more rows than a few-query call takes (and than
# a hybrid's row-by-row recurrence, 16), so the prefill chunk's own kernels are built
WARM_UP_ROWS = few_query_attention.FEW_QUERY_ROWS + 8


def on_gpu(ops: Ops) -> bool:
    """Whether `ops` compute on an MLX GPU (Metal or CUDA)."""
    return ops.name == "mlx" and mx.default_device() == mx.gpu


def fused_decode_for(model: DecoderModel, config: EngineConfig) -> FusedDecode | None:
    """GPU decode is launch-bound: on CUDA, full-attention models take the fused kernels
    (`EngineConfig.fused=False`, BRANCHCHAT_FUSED=0, opts out): the one-launch step at any
    size (it reads the weights as stored), the five kernels where their dense copy is
    small. Compiling the plain MLX step into one graph was measured slower on the H200
    (docs/h200/earlier/decode_compiled.json) and is gone."""
    step_tuning = parse_step_tuning(config.step_tuning) if config.step_tuning else None
    usable = fused_decode_cuda.is_available() and config.fused
    hybrid_step = HYBRID_STEP if config.hybrid_step is None else config.hybrid_step
    gemma_step = GEMMA_STEP if config.gemma_step is None else config.gemma_step
    if not usable or (fused_hybrid.linear_shapes(model.config) and not hybrid_step):
        return None
    if model.config.family == "gemma3" and not gemma_step:
        return None
    one_launch = config.fused_mode != "layers" and step_unsupported_reason(model) is None
    if not one_launch and (
        unsupported_reason(model) is not None or dense_bytes(model) > MAX_DENSE_BYTES
    ):  # the five kernels: their features, their dense copy
        return None
    try:  # compiles its kernels now: a failure shows here
        return FusedDecode(
            model,
            compiled=config.fused_compile,
            mode=config.fused_mode,
            step_tuning=step_tuning,
        )
    except TuningRefused:  # a knob the user set that this model cannot take: say so
        raise
    except Exception:  # an older toolkit or GPU: the plain MLX path still works
        log.exception("fused CUDA decode unavailable; using the plain MLX path")
        return None


def cpu_step_for(model: DecoderModel, config: EngineConfig) -> CpuStep | None:
    """On the NumPy backend, decode and verify rows as one C call where the plan computes
    the model (`EngineConfig.cpu_step=False`, BRANCHCHAT_CPU_STEP=0, opts out)."""
    if not config.cpu_step:
        return None
    reason = cpu_step.unsupported_reason(model)
    if reason is not None:
        log.info("C decode step off: %s", reason)
        return None
    try:  # the plan checks every shape: a model it cannot take keeps the per-op path
        return CpuStep(model)
    except ValueError:
        log.exception("C decode step off: its plan refused the model")
        return None


class ModelRunner:
    """A model with the path its calls take; states it makes follow `snapshot_policy`."""

    def __init__(
        self,
        model: DecoderModel,
        fused: FusedDecode | None = None,
        snapshot_policy: SnapshotPolicy | None = None,
        cpu_step: CpuStep | None = None,
        prefill_rows: int = PREFILL_ROWS,
        queue_steps: bool = True,
    ) -> None:
        self.model = model
        self.queue_steps = queue_steps  # EngineConfig.queue_steps: see can_launch_ahead
        self.prefill_rows = prefill_rows  # the chunk size the session and benches prefill in
        self.fused = fused  # the fused CUDA kernels for calls of 1..16 rows, or None
        self.cpu_step = cpu_step  # the C step for calls of 1..64 rows on the CPU, or None
        self.snapshot_policy = snapshot_policy or SnapshotPolicy()
        self.last_path = ""  # which path the latest forward took: "fused", "cpu_step", "model"

    @classmethod
    def for_device(cls, model: DecoderModel, config: EngineConfig) -> ModelRunner:
        """The fastest exact path on MLX's default device for `model` under `config`."""
        if config.step_tuning:  # a knob's name or value is refused at load, on any machine
            from kernels.fused_step_cuda import check_tuning

            check_tuning(parse_step_tuning(config.step_tuning))
        gpu = on_gpu(model.ops)
        fused = fused_decode_for(model, config) if gpu else None
        forget = getattr(model.ops, "forget_stored", None)
        if forget is not None:  # the step's table, if built, holds its own copy
            forget()
        cpu = cpu_step_for(model, config) if model.ops.name == "numpy" else None
        rows = config.prefill_chunk or (GPU_PREFILL_ROWS if gpu else PREFILL_ROWS)
        return cls(model, fused, config.snapshot_policy, cpu, rows, config.queue_steps)

    @property
    def ops(self) -> Ops:
        return self.model.ops

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    def enable_fused_decode(
        self, kernels: Any = None, compiled: bool = True, mode: str | None = None
    ) -> None:
        """Steps of up to 16 rows through the fused kernels; ValueError when the model
        cannot take them (see `engine.runner.fused.unsupported_reason`)."""
        self.fused = FusedDecode(self.model, kernels=kernels, compiled=compiled, mode=mode)

    def verify_is_exact(self) -> bool:
        """Whether a k-row verify reproduces k one-row steps closely enough for greedy
        speculation to keep the output unchanged: the fused kernels (bit for bit), or
        float32 arithmetic (the C step: bit for bit where its matmuls are row-invariant).
        A GPU's bfloat16/float16 matmuls round 1-row and k-row products differently and
        flip near-ties (measured on the H200: not identical)."""
        return self.fused is not None or "float32" in str(self.ops.dtype)

    def step_row_limit(self) -> int:
        """The most rows a decode-time step should carry (a verify: k drafts + 1): what
        the fused or C step takes, so a verify's rows equal single steps bit for bit."""
        if self.fused is not None:
            return self.fused.row_limit(self.snapshot_policy.sliding_slack)
        return self.cpu_step.max_rows if self.cpu_step is not None else 1 << 30

    def prefill_chunk(self, requested: int) -> int:
        """The rows a prefill chunk should carry: the C step's pieces where its rows are
        row-invariant (a prompt's rows then equal its decoded and verified rows bit for
        bit, which int8 activations need for rollback to equal a fresh prefill), else
        `requested`."""
        if self.cpu_step is not None and self.cpu_step.rows_invariant:
            return min(requested, self.cpu_step.max_rows)
        return requested

    def new_state(self, policy: SnapshotPolicy | None = None) -> SequenceState:
        return self.model.new_state(policy or self.snapshot_policy)

    def forward(self, token_ids: list[int], state: SequenceState, logits: str = "last") -> Array:
        """Append `token_ids` to `state`; logits for "all" rows, the "last" row, or "none"."""
        if self.fused is not None and self.fused.supports(state, len(token_ids)):
            self.last_path = "fused"
            return self.fused(list(token_ids), state, logits)
        if self.cpu_step is not None and self.cpu_step.supports(state, len(token_ids)):
            self.last_path = "cpu_step"
            return self.cpu_step(list(token_ids), state, logits)
        self.last_path = "model"
        return self.model.forward(token_ids, state, logits)

    def warm_up(self) -> Array:
        """A short prompt's prefill, a verify's rows and a decode step, on a state of
        their own: MLX builds each kernel the first time it runs (on CUDA NVRTC compiles
        it, about a minute in all the first time on a machine, 0.3-1.5 s in each later
        process from its disk cache), and the loader calls this so that happens while the
        model loads, not while someone waits for a first reply. The step's logits."""
        vocab = self.config.vocab_size
        state = self.new_state()
        for rows in (WARM_UP_ROWS, 4, 1):
            logits = self.forward([(7 * i + 1) % vocab for i in range(rows)], state)
            mx.eval(logits)
        return logits

    def can_launch_ahead(self, state: SequenceState, taps: Taps = None) -> bool:
        """Whether a one-row plain step of `state` can be queued before the host reads
        its input (engine/runner/ahead.py), handing out `taps`' rows as `forward_hidden`
        does where they are not None: on MLX, through the fused path or the model's own
        (EngineConfig.queue_steps); the NumPy backend computes as it is called."""
        if self.ops.name != "mlx" or not self.queue_steps:
            return False
        if self.fused is not None and self.fused.supports(state, 1):
            return self.fused.can_launch(state, taps)
        return True

    def launch(
        self, ids: Any, state: SequenceState, draw: DeviceDraw | None = None, taps: Taps = None
    ) -> Launch:
        """One row queued on the device, on the path `forward` would take: `ids` [1] a host
        token or the step before's `top`, not yet read; its own `top` the argmax, or
        `draw`'s token with the logits kept for the host (engine/runner/ahead.py); where
        `taps` is not None, the rows `forward_hidden` would give as its `hidden`."""
        if self.fused is not None and self.fused.supports(state, 1):
            self.last_path = "fused"
            if not isinstance(ids, mx.array):
                ids = mx.array(ids, dtype=mx.int32)
            return self.fused.launch(ids, state, draw, taps)
        self.last_path = "model"
        return launch_model(self.model, ids, state, draw, taps)

    def fall_back(self) -> None:
        """A queued one-launch step timed out at a grid barrier: take the five kernels
        from now on, as a synchronous step does (RuntimeError where they cannot)."""
        if self.fused is None:
            raise RuntimeError("no fused path to fall back from")
        self.fused.fall_back()

    def forward_hidden(
        self,
        token_ids: list[int],
        state: SequenceState,
        logits: str = "last",
        taps: tuple[int, ...] = (),
    ) -> tuple[Array, Array]:
        """`forward`, and the last decoder layer's output rows [L, D] (the target rows a
        block drafter's context is made of; with `taps`, those layers' outputs side by
        side), on the path `forward` would take."""
        if self.fused is not None and self.fused.supports(state, len(token_ids)):
            self.last_path = "fused"
            return self.fused.forward_hidden(list(token_ids), state, logits, taps)
        if self.cpu_step is not None and self.cpu_step.supports(state, len(token_ids)):
            self.last_path = "cpu_step"
            return self.cpu_step.forward_hidden(list(token_ids), state, logits, taps)
        self.last_path = "model"
        return self.model.forward_hidden(token_ids, state, logits, taps)

    def tap_problem(self, taps: tuple[int, ...]) -> str | None:
        """Why `forward_hidden` cannot hand out these layers' rows on every path, or None."""
        if taps and self.fused is not None and self.fused.step_kernel is not None:
            return (
                "the one-launch GPU step hands out the last layer's rows alone "
                "(BRANCHCHAT_FUSED_MODE=layers hands out any layers')"
            )
        return None
