"""The execution path of a loaded model: which forward runs a call (the fused CUDA step,
the C step on a CPU, or the model's own), whether a verify is exact on this device and
dtype, and how many rows one step may carry. Models stay pure forward functions; the
runner decides."""

from engine.runner.runner import ModelRunner, cpu_step_for, fused_decode_for

__all__ = ["ModelRunner", "cpu_step_for", "fused_decode_for"]
