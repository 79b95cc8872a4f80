"""`python -m bench attention`: one attention call of one layer, on the CPU, by itself.

For each model's head shape (the default model: 9 query heads over 3 kv heads of 64;
Gemma 3 270M: 4 over 1 of 256), decode and verify rows (1 and 8) at contexts 128..8192,
K/V float32 and float16: the time of a call through the C kernel (kernels.qmatmul.attention,
what NumpyOps.attention sends few rows to) and the K/V bytes it reads per second. At long
context decode attention is bound by those bytes: the default model's 30 layers read
189 MB of float16 K/V a step at 8192.

--prefill times a prefill chunk instead (256 query rows, causal, at the end of each
context) through the C kernel and through NumPy's BLAS path (NumpyOps with the kernel off).
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench import common
from engine.config import EngineConfig
from kernels import qmatmul
from kernels.ops_numpy import NumpyOps

SHAPES = {"default": (9, 3, 64), "gemma3": (4, 1, 256)}  # (query heads, kv heads, head dim)
CONTEXTS = (128, 512, 2048, 8192)
ROWS = (1, 8)
DTYPES = {"float32": np.float32, "float16": np.float16}
PREFILL_ROWS = 256
MIN_SECONDS = 0.05  # repeat a call for at least this long per sample


def inputs(
    shape: tuple[int, int, int], rows: int, context: int, dtype: type, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """q [Hq, rows, D]; k, v: views [Hkv, context, D] of a cache with room to spare; the
    rows' causal mask (None for one row: it sees every key)."""
    Hq, Hkv, D = shape
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((Hq, rows, D)).astype(np.float32)
    capacity = context + 256
    k: np.ndarray = rng.standard_normal((Hkv, capacity, D)).astype(dtype)[:, :context]
    v: np.ndarray = rng.standard_normal((Hkv, capacity, D)).astype(dtype)[:, :context]
    if rows == 1:
        return q, k, v, None
    mask = np.arange(context)[None, :] <= (context - rows + np.arange(rows))[:, None]
    return q, k, v, mask


def seconds_per_call(fn: Callable[[], Any], runs: int) -> dict[str, float]:
    fn()  # warm up: pages, caches, the pool's threads
    samples = []
    for _ in range(runs):
        calls, t0 = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= MIN_SECONDS:
                break
        samples.append(elapsed / calls)
    return common.spread(samples)


def decode_points(args: argparse.Namespace) -> list[dict[str, Any]]:
    points = []
    for name, shape in SHAPES.items():
        for rows in args.rows:
            for context in args.contexts:
                for dtype_name in args.dtypes:
                    q, k, v, mask = inputs(shape, rows, context, DTYPES[dtype_name])
                    scale = shape[2] ** -0.5
                    call = functools.partial(qmatmul.attention, q, k, v, scale, mask)
                    t = seconds_per_call(call, args.runs)
                    kv_bytes = 2 * k.shape[0] * context * shape[2] * k.itemsize
                    point = {"shape": name, "rows": rows, "context": context, "kv": dtype_name}
                    point.update(seconds=t, kv_gb_per_s=kv_bytes / t["median"] / 1e9)
                    points.append(point)
                    if not args.json:
                        print(
                            f"{name:8s} rows {rows:2d} ctx {context:5d} {dtype_name:8s}"
                            f" {t['median'] * 1e6:9.1f} us {point['kv_gb_per_s']:6.1f} GB/s"
                        )
    return points


def prefill_points(args: argparse.Namespace) -> list[dict[str, Any]]:
    numpy_path = NumpyOps(packed=False)  # the kernel off: NumPy's BLAS path
    points = []
    for name, shape in SHAPES.items():
        for context in [c for c in args.contexts if c >= PREFILL_ROWS]:
            for dtype_name in args.dtypes:
                q, k, v, mask = inputs(shape, PREFILL_ROWS, context, DTYPES[dtype_name])
                scale = shape[2] ** -0.5
                paths = {
                    "c": functools.partial(qmatmul.attention, q, k, v, scale, mask),
                    "numpy": functools.partial(numpy_path.attention, q, k, v, scale, mask),
                }
                point: dict[str, Any] = {"shape": name, "context": context, "kv": dtype_name}
                for path, fn in paths.items():  # interleaved per point: the same load for both
                    point[path] = seconds_per_call(fn, args.runs)
                points.append(point)
                if not args.json:
                    c_ms, np_ms = point["c"]["median"] * 1e3, point["numpy"]["median"] * 1e3
                    print(
                        f"{name:8s} {PREFILL_ROWS} rows ctx {context:5d} {dtype_name:8s}"
                        f"  C {c_ms:8.2f} ms  NumPy {np_ms:8.2f} ms"
                    )
    return points


def main(argv: list[str], config: EngineConfig | None = None) -> int:
    del config  # one kernel call: no engine is built
    parser = argparse.ArgumentParser(prog="python -m bench attention", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--threads", type=int, default=None, help="the pool's (default: all)")
    parser.add_argument("--prefill", action="store_true", help=f"{PREFILL_ROWS}-row chunks")
    args = parser.parse_args(argv)
    if not qmatmul.available():
        print("error: kernels._qmatmul is not built (pip install -e . builds it)")
        return 1
    threads = args.threads or qmatmul.default_num_threads()
    qmatmul.set_num_threads(threads)
    common.warn_if_busy()
    result: dict[str, Any] = {"command": "python -m bench attention " + " ".join(argv)}
    result["threads"] = threads
    result["isa"] = qmatmul._ext.info()["isa"]
    result["points"] = prefill_points(args) if args.prefill else decode_points(args)
    result.update(machine=common.machine(), versions=common.versions())
    return common.report("attention", common.rounded(result), args.json)
