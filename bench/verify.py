"""`python -m bench verify`: what a forward of m rows costs against one decode step.

This curve decides whether speculation can pay on a device: on MLX's CPU backend it is
close to m, through BLAS or on a GPU it is far flatter. Measured at a fixed context on
the default model (and, with --hybrid, on the random-weight Qwen3.5-style model).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench import common
from engine.config import EngineConfig
from engine.loader import load_model
from engine.models.protocol import Model
from engine.sequence import prefill

ROWS = (1, 2, 4, 8, 16, 32)


def curve(model: Model, context: int, runs: int) -> dict[int, dict[str, float]]:
    state = model.new_state()
    prefill(model, state, [(7 * i) % 1000 + 10 for i in range(context)])
    out = {}
    for rows in ROWS:
        samples = []
        for _ in range(runs + 1):
            cp = state.checkpoint()
            samples.append(common.timed(lambda r=rows: model.forward([11] * r, state, "all")))
            state.rollback(cp)
        out[rows] = common.spread(samples[1:])  # the first run may trace or warm up
    return out


def main(argv: list[str], config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench verify", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--backend", choices=("numpy", "mlx"), default=None)
    parser.add_argument("--hybrid", action="store_true", help="also the Qwen3.5-style model")
    args = parser.parse_args(argv)
    config = common.engine_config(config, args.backend)
    models = {"default": common.default_model()}
    with tempfile.TemporaryDirectory() as tmp:
        if args.hybrid:
            tok_dir = common.converted_default_model(Path(tmp) / "converted")
            models["hybrid"] = common.write_hybrid_model(Path(tmp) / "hybrid", tok_dir)
        result: dict[str, Any] = {"command": "python -m bench verify " + " ".join(argv)}
        for name, path in models.items():
            lm = load_model(path, config)
            points = curve(lm.runner, args.context, args.runs)
            step = points[1]["median"]
            result[name] = {
                "backend": lm.ops.name,
                "seconds": {m: p for m, p in points.items()},
                "in_decode_steps": {m: p["median"] / step for m, p in points.items()},
            }
            if not args.json:
                print(f"{name} ({lm.ops.name}, context {args.context}):")
                for m, p in points.items():
                    ms, steps = p["median"] * 1e3, p["median"] / step
                    print(f"  {m:3d} rows  {ms:8.2f} ms  {steps:5.2f} steps")
    result.update(context=args.context, machine=common.machine(), versions=common.versions())
    result = common.rounded(result)
    return common.report("verify", result, args.json)
