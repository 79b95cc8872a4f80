"""Debug probe: where a one-launch step's time goes (GPU only).

With and without the L2 prefetch of the next layer's weights: the engine's step kernel's
time (no logits, last row's logits), and from a build of the same kernel with cycle
stamps at its barriers (bench/gpu/step_stamps.py: the engine's build has none), per
phase kind (embed, A qkv, B attention, C o_proj, D gate/up, E down, head): the median
over layers of the phase interval (release to release, block 0's clock), the slowest
block's work and the mean block's work, in us. By default the model is the default
model's shapes with random dense weights; `--model` takes a GGUF file instead (its
weight table as stored).

    python -m bench.gpu.step_probe [--model PATH] [--contexts 128 2048] [--prefetch 0 1]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import mlx.core as mx
import numpy as np

from bench.gpu.probe import random_model
from bench.gpu.step_stamps import StampedStepKernel
from engine.config import EngineConfig
from engine.loader import load_model
from kernels.ops import make_ops

KINDS = ["A_qkv", "B_attention", "C_o_proj", "D_gate_up", "E_down"]


def summarize(stamps: np.ndarray, layers: int, blocks: int) -> dict[str, Any]:
    slots, row = 5 * layers + 2, blocks + 1
    total_ns, total_cycles = int(stamps[slots * row]), int(stamps[slots * row + 1])
    us = total_ns / total_cycles / 1000  # per cycle
    table = stamps[: slots * row].reshape(slots, row).astype(np.float64)
    interval, work = table[:, 0] * us, table[:, 1:] * us
    out: dict[str, Any] = {"kernel_us": total_ns / 1000, "ghz": total_cycles / total_ns}
    out["embed"] = {"interval": interval[0], "max_work": work[0].max()}
    for i, kind in enumerate(KINDS):
        idx = [1 + 5 * layer + i for layer in range(layers)]
        out[kind] = {
            "interval": float(np.median(interval[idx])),
            "max_work": float(np.median(work[idx].max(axis=1))),
            "mean_work": float(np.median(work[idx].mean(axis=1))),
        }
    out["head"] = {"max_work": float(work[-1].max()), "mean_work": float(work[-1].mean())}
    return out


def probe(model: Any, context: int, prefetch: bool) -> dict[str, Any]:
    f = model.fused
    state = model.new_state()
    model.forward(list(range(context)), state)
    model.forward([5], state)  # through the fused path: every layer at one capacity
    kvs = list(state.layers)
    ids = mx.array([5], dtype=mx.int32)
    pos = mx.array([context + 1], dtype=mx.int32)
    keys, values = [kv.keys for kv in kvs], [kv.values for kv in kvs]

    def call(head_mode: int) -> Any:
        return f.step_kernel(ids, pos, f.weights, f.norms, keys, values, head_mode, prefetch)

    out: dict[str, Any] = {}

    def timeit(name: str, fn: Any, n: int = 200) -> None:
        for _ in range(10):
            fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t0) / n * 1000

    timeit("none_eval_ms", lambda: mx.eval(*call(0)))
    timeit("last_eval_ms", lambda: mx.eval(*call(1)))
    kernel = f.step_kernel  # the engine's build: its tuning too
    stamped = StampedStepKernel(
        kernel.s, kernel.L, f.weights.formats, prefetch, kernel.tuning, f.weights.roles
    )
    runs = []
    for _ in range(20):
        logits, _, status, stamps = stamped.launch(
            ids, pos, f.weights, f.norms, keys, values, head_mode=1
        )
        mx.eval(logits, status, stamps)
        runs.append(np.array(stamps))
    out["status"] = int(np.array(status)[0])
    prof = [summarize(r, len(kvs), stamped.blocks) for r in runs[5:]]
    best = min(prof, key=lambda p: p["kernel_us"])
    out["profile_fastest_of_15"] = best
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 2048])
    ap.add_argument("--prefetch", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--model", default=None, help="a .gguf file (default: random weights)")
    args = ap.parse_args()
    if args.model:
        model = load_model(args.model, EngineConfig.from_environment()).runner
    else:
        model = random_model(make_ops("mlx"))
        model.enable_fused_decode(mode="step")
    if model.fused is None or model.fused.step_kernel is None:
        raise SystemExit("the model takes no one-launch step here")
    out = {}
    for prefetch in args.prefetch:
        for context in args.contexts:
            out[f"prefetch{prefetch}_ctx{context}"] = probe(model, context, bool(prefetch))
            print(
                json.dumps(
                    {f"prefetch{prefetch}_ctx{context}": out[f"prefetch{prefetch}_ctx{context}"]}
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
