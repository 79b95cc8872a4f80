"""Debug probe: the one-launch step's build knobs, timed on a real model (GPU only).

Each configuration (kernels/fused_step_cuda.py's TUNING: slices of words a warp loads
at once, whether it decodes them as used, rows of x a verify's pass takes, blocks an SM,
floats of x staged in shared memory) is its own
build of the engine's kernel on the model's weight table. Per configuration and context:
a decode step's launch and wait (one row, the last row's logits) and a verify's (8 rows,
every row's logits), in ms, medians of `--repeats`; and whether its logits equal the
engine build's bit for bit (they must: every knob keeps a row's operations and order).
A configuration whose table layout differs from the engine's (FQ_KFACTORS, the ninth
field) runs on the weights of a second load of the model with that layout, against the
same KV cache and the same reference logits: both layouts side by side in one run. A
hybrid (with BRANCHCHAT_HYBRID_STEP=1) runs every build on its linear layers' states too.

    python -m bench.gpu.step_tuning [--model PATH] [--configs 8:0:2,16:1:4:2:8192,...]
        [--engine-with "FQ_KFACTORS=1;FQ_STREAM=1,FQ_VERIFY_STREAM=0"]
        [--contexts 128 2048] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np

from engine.config import EngineConfig, parse_step_tuning
from engine.loader import load_model
from engine.runner import fused_hybrid
from kernels.fused_step_cuda import TUNING, StepKernel
from kernels.step_knobs import check_tuning

# the next round's: fewer slices in flight so two blocks' 128 registers do not spill (Llama:
# none at 4, 156 bytes at 8), a verify of 4 or 8 rows a pass in one block, x left in L2,
# K-quant factors (the table's other layout: a second load of the model), and the barrier
# with the L1 prefetch again on one block (6% / 2% on the default model, inside the noise)
DEFAULT_CONFIGS = (
    "8:0:2:1:0,8:0:2:1,8:0:2:2,4:0:2:2,4:0:4:2:16384:1,8:0:4:2:16384:1,8:0:8:2:16384:1,"
    "8:0:4:1:16384,4:0:4:1:16384,8:0:2:2:8192:0:0:0:1,4:0:2:2:8192:0:0:0:1,8:0:2:1:8192:0:1:1"
)
_FIELDS = [
    "FQ_SLICES",
    "FQ_STREAM",
    "FQ_VERIFY_ROWS",
    "FQ_BLOCKS",
    "FQ_SMEM_X",
    "FQ_VERIFY_BLOCKS",
    "FQ_BARRIER",
    "FQ_L1_PREFETCH",
    "FQ_KFACTORS",
    "FQ_SPREAD",
    "FQ_HEAD_ROWS",
    "FQ_VERIFY_STREAM",
    "FQ_VERIFY_SMEM_X",
    "FQ_SWIZZLE",
    "FQ_WIDE",
    "FQ_WIDE_SLICES",
    "FQ_INT8",
    "FQ_INT8_RESIDUAL",
    "FQ_INT8_ONCE",
]


def parse_configs(text: str) -> list[dict[str, int]]:
    """ "slices:stream:rows[:blocks:smem:vblocks:barrier:l1:kf:spread:head:vstream:vsmem:swizzle:
    wide:wslices:int8:int8_residual:int8_once],..."
    (any prefix of the fields) as TUNING dicts; the fields left out take the engine's values."""
    out = []
    for item in text.split(","):
        values = [int(v) for v in item.split(":")]
        if not 3 <= len(values) <= len(_FIELDS):
            raise SystemExit(
                "a configuration is slices:stream:rows"
                "[:blocks:smem:vblocks:barrier:l1:kf:spread:head:vstream:vsmem:swizzle:wide:"
                f"wslices:int8:int8_residual:int8_once], not {item!r}"
            )
        out.append(
            {name: TUNING[name] for name in _FIELDS}
            | dict(zip(_FIELDS[: len(values)], values, strict=True))
        )
    return out


def engine_with(engine: dict[str, int], text: str) -> list[dict[str, int]]:
    """ "KNOB=V,...;KNOB=V,..." as the engine's knobs with each item's changed, between the
    engine's own first (the reference) and last."""
    changed = [check_tuning(engine | parse_step_tuning(item)) for item in text.split(";")]
    return [engine, *changed, engine]


def _median_ms(fn: Any, repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1000)


def probe(
    model: Any, configs: list[dict[str, int]], context: int, repeats: int, tables: dict[int, Any]
) -> list[Any]:
    """Each configuration timed on the table of its layout (`tables`: FQ_KFACTORS -> a
    runner's fused path whose weights have that layout; the engine's is `model`'s)."""
    f = model.runner.fused
    if f is None or f.step_kernel is None:
        raise SystemExit("the model takes no one-launch step here")
    state = model.runner.new_state()
    model.runner.forward(list(range(3, 3 + context)), state)
    model.runner.forward([5], state)  # through the step: every layer at one capacity
    split = fused_hybrid.split_layers(state.layers)
    assert split is not None
    kvs, recurrent = split  # a hybrid's linear layers (BRANCHCHAT_HYBRID_STEP=1) read theirs
    keys, values = [kv.keys for kv in kvs], [kv.values for kv in kvs]
    linear = (f.linear_params, *fused_hybrid.linear_inputs(recurrent)) if recurrent else None
    pos = mx.array([context + 1], dtype=mx.int32)
    one, eight = mx.array([5], dtype=mx.int32), mx.array(list(range(5, 13)), dtype=mx.int32)
    base = f.step_kernel
    rows = []
    reference: list[np.ndarray] = []
    for tuning in configs:
        try:
            weights = tables[tuning["FQ_KFACTORS"]].weights
            kernel = base if tuning == base.tuning else StepKernel(
                base.s, base.L, weights.formats, tuning=tuning, roles=weights.roles
            )  # fmt: skip
            mx.eval(kernel(one, pos, weights, f.norms, keys, values, 1, linear=linear))
        except (RuntimeError, ValueError) as e:  # a build the compiler refuses
            rows.append({"tuning": tuning, "error": str(e)[:400]})
            print(json.dumps({"context": context, **rows[-1]}), flush=True)
            continue

        def step(ids: mx.array, head_mode: int, kernel: Any = kernel, w: Any = weights) -> Any:
            out, status = kernel(ids, pos, w, f.norms, keys, values, head_mode, linear=linear)
            mx.eval(out, status)
            if int(status.item()):
                raise SystemExit(f"a grid barrier timed out with {kernel.tuning}")
            return out

        logits = [np.array(step(one, 1)), np.array(step(eight, 2))]
        if not reference:
            reference = logits
        same = all(np.array_equal(a, b) for a, b in zip(logits, reference, strict=True))
        # a build of other bits (FQ_WIDE): how far, relative to the reference's largest logit
        gap = max(
            float(np.abs(a - b).max() / np.abs(b).max())
            for a, b in zip(logits, reference, strict=True)
        )
        rows.append(
            {
                "tuning": tuning,
                "decode_ms": _median_ms(lambda: step(one, 1), repeats),
                "verify_8_ms": _median_ms(lambda: step(eight, 2), repeats),
                "logits_equal_first": same,
                "max_gap_first": gap,
            }
        )
        print(json.dumps({"context": context, **rows[-1]}), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a .gguf file (default: the default model)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="slices:stream:rows[:...],...")
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 2048])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--engine-with",
        default=None,
        help="KNOB=V[,...][;...]: instead of --configs, the engine's build with these knobs "
        "changed, each build between the engine's own timed first and last",
    )
    args = ap.parse_args()
    from engine.default_model import default_model_path

    config = EngineConfig.from_environment()
    model = load_model(args.model or default_model_path(), config)
    kernel = model.runner.fused.step_kernel if model.runner.fused else None
    engine = kernel.tuning if kernel is not None else dict(TUNING)  # tuning_for's choice
    if args.engine_with:
        configs = engine_with(engine, args.engine_with)
    else:
        configs = parse_configs(args.configs)
    tables = {engine["FQ_KFACTORS"]: model.runner.fused}
    for layout in {c["FQ_KFACTORS"] for c in configs} - set(tables):  # a second load
        knobs = ",".join(filter(None, [config.step_tuning, f"FQ_KFACTORS={layout}"]))
        other = replace(config, step_tuning=knobs)
        tables[layout] = load_model(args.model or default_model_path(), other).runner.fused
    if engine in configs:
        configs.remove(engine)
    configs.insert(0, engine)  # the engine's build first: the reference
    result = {
        "model": str(args.model or "default"),
        "engine_tuning": engine,
        "contexts": {str(c): probe(model, configs, c, args.repeats, tables) for c in args.contexts},
    }
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
