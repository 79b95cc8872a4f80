"""Which product and chunk make a GPU prefill fastest, and what each costs in agreement
with float64: python -m bench.gpu.prefill_probe (on the H200, the default model fetched).

For every `MlxOps.wide_matmul` (--modes) and chunk, with each layer's output handed to the
GPU as it is built or not (--overlap, `MlxOps.overlap_layers`): prefill tok/s at
each context (the best of --runs after one uncounted warm-up: a first call of a shape
compiles MLX's kernels), and teacher-forced top-1 / mean KL against the fixture's float64
forward in forwards of the chunk's rows; and one projection's time per mode and row count.
Prints one JSON object and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx

from engine.config import EngineConfig
from engine.default_model import default_model_path
from engine.loader import load_model
from engine.sequence import prefill
from kernels.ops_mlx import WIDE_MATMULS
from tests.oracles import topk_stats
from tests.oracles.fixture_files import real_reference


def prefill_rate(runner: Any, ids: list[int], chunk: int, runs: int) -> float:
    best = float("inf")
    for run in range(runs + 1):
        state = runner.new_state()
        t0 = time.perf_counter()
        logits = prefill(runner, state, ids, chunk_size=chunk)
        runner.ops.argmax_rows(logits)
        if run:  # the first is the warm-up
            best = min(best, time.perf_counter() - t0)
    return len(ids) / best


def projection_ms(ops: Any, w: Any, rows: int, runs: int = 20) -> float:
    x = mx.random.normal((rows, int(w.shape[1]))).astype(mx.float32)
    mx.eval(ops.linear(x, w))
    t0 = time.perf_counter()
    for _ in range(runs):
        y = ops.linear(x, w)
        mx.eval(y)
    return (time.perf_counter() - t0) / runs * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default=",".join(WIDE_MATMULS))
    parser.add_argument("--chunks", default="256,512,1024,2048")
    parser.add_argument("--contexts", default="512,1024,2048,8192")
    parser.add_argument("--overlap", default="off", help="off, on, or off,on: both")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("prefill_probe.json"))
    args = parser.parse_args()
    config = replace(EngineConfig.from_environment(), backend="mlx")
    runner = load_model(default_model_path(), config).runner
    ops = runner.ops
    ref = real_reference("smollm2")
    text_ids = [int(t) for t in ref["ids"]]
    contexts = [int(c) for c in args.contexts.split(",")]
    ids = (text_ids * (max(contexts) // len(text_ids) + 1))[: max(contexts)]
    result: dict[str, Any] = {"device": str(mx.default_device()), "modes": {}}
    up = runner.model.layers[0].mlp.gate_up.w
    for mode in args.modes.split(","):
        ops.wide_matmul = mode
        entry: dict[str, Any] = {"projection_ms": {}, "chunks": {}}
        for rows in (16, 64, 256, 1024, 2048):
            entry["projection_ms"][rows] = round(projection_ms(ops, up, rows), 4)
        for chunk in [int(c) for c in args.chunks.split(",")]:
            got = topk_stats.figures(
                ref, **topk_stats.teacher_forced(runner, text_ids, ref["f64_top_ids"], chunk)
            )
            figures: dict[str, Any] = {k: round(v, 6) for k, v in got.items()}
            for overlap in args.overlap.split(","):
                ops.overlap_layers = overlap == "on"
                key = "tok_s" if overlap == "off" else "overlapped_tok_s"
                figures[key] = {
                    c: round(prefill_rate(runner, ids[:c], chunk, args.runs)) for c in contexts
                }
            ops.overlap_layers = False
            entry["chunks"][chunk] = figures
            print(mode, chunk, json.dumps(figures), flush=True)
        result["modes"][mode] = entry
    text = json.dumps(result, indent=1)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
