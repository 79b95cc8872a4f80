"""`python -m bench matmul`: the CPU kernels on the real models' projection shapes.

For each projection of layer 0 (q|k|v, o, gate|up, down) and the head of the default
model (SmolLM2, Q4_1 + a Q8_0 head) and Gemma 3 270M (Q5_0/Q8_0/Q4_K/Q6_K + a Q8_0 head),
at 1 (decode), 8 (verify) and 256 (a prefill chunk) rows: the int8 kernel
(kernels/int8_matmul.py), the float kernel (kernels/qmatmul.py's C tiles) and
dequantize + BLAS (its path for long prefills). Figures: time, GB/s of the weights the
kernel reads (packed bytes / time) and GMAC/s. The variants run interleaved, best of
--runs, so a busy machine slows all alike.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import common
from engine.config import EngineConfig

ROWS = (1, 8, 256)
# GGUF tensor names of each projection's parts (fused as the engine fuses them)
PROJECTIONS = {
    "qkv": ("attn_q", "attn_k", "attn_v"),
    "o": ("attn_output",),
    "gate_up": ("ffn_gate", "ffn_up"),
    "down": ("ffn_down",),
}
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3_270m": "gemma-3-270m-q4_k_m.gguf"}


def projections(path: Path) -> dict[str, list[Any]]:
    """name -> the QuantizedWeight parts of that projection (layer 0) and the head."""
    from engine.gguf_file import read_gguf_file

    _, tensors = read_gguf_file(path)
    found = {
        name: [tensors[f"blk.0.{part}.weight"] for part in parts]
        for name, parts in PROJECTIONS.items()
    }
    found["head"] = [tensors.get("output.weight", tensors["token_embd.weight"])]
    return found


def variants(parts: list[Any]) -> tuple[dict[str, Any], int, int, int]:
    """The callables (x -> out) of each kernel for one projection, n, k, packed bytes."""
    from kernels import qmatmul
    from kernels.ops_numpy import NumpyOps

    int8_ops, float_ops = NumpyOps(cpu_matmul="int8"), NumpyOps(cpu_matmul="float")
    w8 = int8_ops.concat_weights([int8_ops.weight(p) for p in parts])
    wf = float_ops.concat_weights([float_ops.weight(p) for p in parts])
    n, k = w8.shape
    float_parts = wf.parts if hasattr(wf, "parts") else (wf,)
    ext = qmatmul._ext

    def float_kernel(x: np.ndarray) -> None:  # the C tiles at any row count
        for part in float_parts:
            out = np.empty((x.shape[0], part.shape[0]), np.float32)
            ext.matmul(x, part.packed, part.scales, part.biases, part.group_size, part.bits, out)

    def dequant_blas(x: np.ndarray) -> None:
        for part in float_parts:
            qmatmul._matmul_blocked(x, part)

    calls = {
        "int8": lambda x: int8_ops.linear(x, w8),
        "float": float_kernel,
        "dequant_blas": dequant_blas,
    }
    return calls, n, k, int(w8.nbytes)


def measure(calls: dict[str, Any], x: np.ndarray, runs: int, reps: int) -> dict[str, float]:
    """Best seconds per call of each variant, the variants interleaved run by run."""
    best = dict.fromkeys(calls, float("inf"))
    for name in calls:  # warm: caches, the pool's threads, BLAS's scratch
        calls[name](x)
    for _ in range(runs):
        for name, fn in calls.items():
            best[name] = min(best[name], _seconds_per_call(fn, x, reps))
    return best


def _seconds_per_call(fn: Any, x: np.ndarray, reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        fn(x)
    return (time.perf_counter() - start) / reps


def run(model_names: list[str], runs: int, rows: tuple[int, ...] = ROWS) -> dict[str, Any]:
    from kernels import int8_matmul, qmatmul

    rng = np.random.default_rng(0)
    root = Path.home() / ".cache/branchchat/models"
    results: list[dict[str, Any]] = []
    for model in model_names:
        path = root / MODELS[model]
        if not path.is_file():
            print(f"{model}: {path} is absent, left out (`python -m engine fetch`)")
            continue
        for proj, parts in projections(path).items():
            calls, n, k, nbytes = variants(parts)
            for m in rows:
                x = rng.standard_normal((m, k)).astype(np.float32)
                reps = max(1, int(3e7 // (n * k * max(m, 16))))
                best = measure(calls, x, runs, reps)
                row: dict[str, Any] = {"model": model, "proj": proj, "n": n, "k": k, "m": m}
                row["weight_mb"] = nbytes / 1e6
                for name, seconds in best.items():
                    row[name] = {
                        "us": seconds * 1e6,
                        "gb_s": nbytes / seconds / 1e9,
                        "gmac_s": m * n * k / seconds / 1e9,
                    }
                row["int8_speedup_vs_float"] = best["float"] / best["int8"]
                row["int8_speedup_vs_dequant_blas"] = best["dequant_blas"] / best["int8"]
                results.append(row)
    return {
        "machine": common.machine(),
        "versions": common.versions(),
        "int8": int8_matmul.info(),
        "float_kernel": {"isa": qmatmul._ext.info()["isa"]},
        "threads": qmatmul._ext.get_num_threads(),
        "runs": runs,
        "results": results,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"int8 path {result['int8']['path']}, threads {result['threads']}")
    print(
        f"{'model':12} {'proj':8} {'n x k':>12} {'m':>4}   int8 us (GB/s, GMAC/s)"
        "    float us      BLAS us   x float  x BLAS"
    )
    for r in result["results"]:
        i8, fl, bl = r["int8"], r["float"], r["dequant_blas"]
        print(
            f"{r['model']:12} {r['proj']:8} {r['n']:>6}x{r['k']:<5} {r['m']:>4}"
            f" {i8['us']:9.1f} ({i8['gb_s']:5.1f}, {i8['gmac_s']:6.1f})"
            f" {fl['us']:10.1f} {bl['us']:12.1f} {r['int8_speedup_vs_float']:8.2f}"
            f" {r['int8_speedup_vs_dequant_blas']:7.2f}"
        )


def main(argv: list[str], config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench matmul", description=__doc__)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--runs", type=int, default=5, help="interleaved runs; the best counts")
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="rows of x")
    parser.add_argument("--threads", type=int, help="the kernels' threads (default: all cores)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    del config  # the kernels are called directly: no engine is built
    from kernels import int8_matmul

    if not int8_matmul.available():
        print("kernels._qmatmul is not built (pip install -e . builds it)")
        return 1
    if args.threads:
        from kernels import qmatmul

        qmatmul.set_num_threads(args.threads)
    load = common.warn_if_busy()
    result = run(args.models, args.runs, tuple(args.rows))
    result["machine"]["load_average_1m"] = round(load, 2)
    return common.report("matmul", common.rounded(result), args.json, print_table)
