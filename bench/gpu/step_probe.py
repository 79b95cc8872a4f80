"""Debug probe: where a one-launch step's time goes (GPU only).

With and without the L2 prefetch of the next layer's weights: the engine's step kernel's
time (no logits, last row's logits), and from a build of the same kernel with cycle
stamps at its barriers (bench/gpu/step_stamps.py: the engine's build has none), per
phase kind (embed, each layer kind's phases as bench/gpu/step_stamps.py names them, head):
the median over layers of the phase interval (release to release, block 0's clock), the
slowest block's work and the mean block's work, in us. Every family the step takes: a
hybrid's linear layers read their states, Gemma's rings are its sliding layers' KV. By
default the model is the default model's shapes with random dense weights; `--model`
takes a GGUF file instead (its weight table as stored).

    python -m bench.gpu.step_probe [--model PATH] [--contexts 128 2048] [--prefetch 0 1] \
        [--rows 1 8]

`--rows` past 1 probes the verify build as a verify calls it (every row's logits): where
a k-row verify's time goes beside a step's (docs/BENCHMARKS.md, "Verify cost").
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import mlx.core as mx
import numpy as np

from bench.gpu.probe import random_model
from bench.gpu.step_stamps import StampedStepKernel, phases
from engine.config import EngineConfig
from engine.loader import load_model
from engine.runner import fused_hybrid
from kernels.ops import make_ops


def summarize(stamps: np.ndarray, rows: list[tuple[int, str]], blocks: int) -> dict[str, Any]:
    """Per phase kind (`rows`: step_stamps.phases, a stamp row each), the median over
    layers of the interval, the slowest block's work and the mean block's work, in us."""
    slots, row = len(rows), blocks + 1
    total_ns, total_cycles = int(stamps[slots * row]), int(stamps[slots * row + 1])
    us = total_ns / total_cycles / 1000  # per cycle
    table = stamps[: slots * row].reshape(slots, row).astype(np.float64)
    interval, work = table[:, 0] * us, table[:, 1:] * us
    out: dict[str, Any] = {"kernel_us": total_ns / 1000, "ghz": total_cycles / total_ns}
    for kind in dict.fromkeys(name for _, name in rows):
        idx = [i for i, (_, name) in enumerate(rows) if name == kind]
        out[kind] = {
            "layers": len(idx),
            "interval": float(np.median(interval[idx])),
            "max_work": float(np.median(work[idx].max(axis=1))),
            "mean_work": float(np.median(work[idx].mean(axis=1))),
        }
    del out["head"]["interval"]  # the launch ends there: no release follows
    return out


def probe(model: Any, context: int, prefetch: bool, rows: int = 1) -> dict[str, Any]:
    f = model.fused
    state = model.new_state()
    model.forward(list(range(context)), state)
    model.forward([5], state)  # through the fused path: every layer at one capacity
    split = fused_hybrid.split_layers(state.layers)
    assert split is not None
    kvs, recurrent = split  # a hybrid's linear layers read their states too
    linear = (f.linear_params, *fused_hybrid.linear_inputs(recurrent)) if recurrent else None
    ids = mx.array([5] * rows, dtype=mx.int32)
    pos = mx.array([context + 1], dtype=mx.int32)
    head = 1 if rows == 1 else 2  # a verify reads every row's logits
    keys, values = [kv.keys for kv in kvs], [kv.values for kv in kvs]

    def call(head_mode: int) -> Any:
        return f.step_kernel.launch(
            ids, pos, f.weights, f.norms, keys, values, head_mode, prefetch, linear
        )

    out: dict[str, Any] = {}

    def timeit(name: str, fn: Any, n: int = 200) -> None:
        for _ in range(10):
            fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t0) / n * 1000

    timeit("none_eval_ms", lambda: mx.eval(*call(0)))
    timeit("last_eval_ms" if rows == 1 else "all_eval_ms", lambda: mx.eval(*call(head)))
    kernel = f.step_kernel  # the engine's build: its tuning too
    stamped = StampedStepKernel(
        kernel.s, kernel.L, f.weights.formats, prefetch, kernel.tuning, f.weights.roles
    )
    runs = []
    for _ in range(20):
        outs = stamped.launch(ids, pos, f.weights, f.norms, keys, values, head, linear=linear)
        mx.eval(*outs)
        runs.append(np.array(outs[-1]))
    out["status"] = int(np.array(outs[2])[0])
    blocks = stamped.blocks if rows == 1 else stamped.verify_blocks  # the stamps' row stride
    prof = [summarize(r, phases(kernel.s, kernel.L), blocks) for r in runs[5:]]
    best = min(prof, key=lambda p: p["kernel_us"])
    out["profile_fastest_of_15"] = best
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 2048])
    ap.add_argument("--prefetch", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--model", default=None, help="a .gguf file (default: random weights)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1], help="1: a step; more: a verify")
    args = ap.parse_args()
    if args.model:
        model = load_model(args.model, EngineConfig.from_environment()).runner
    else:
        model = random_model(make_ops("mlx"))
        model.enable_fused_decode(mode="step")
    if model.fused is None or model.fused.step_kernel is None:
        raise SystemExit("the model takes no one-launch step here")
    for prefetch in args.prefetch:
        for context in args.contexts:
            for rows in args.rows:
                name = f"prefetch{prefetch}_ctx{context}" + (f"_rows{rows}" if rows > 1 else "")
                result = probe(model, context, bool(prefetch), rows)
                print(json.dumps({name: result}), flush=True)


if __name__ == "__main__":
    main()
