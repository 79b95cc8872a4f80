"""Debug probe: the nucleus pack kernel's time on a GPU (kernels/nucleus_pack_cuda.py), a
sampled decode step's work after the step kernel. Random logits rows of the vocabulary's
length; each kernel build is timed two ways: `batched`, many packs of distinct rows in one
evaluation (independent of one another, so the device may run several side by side: a
throughput, not one pack's time), and `alone`, one pack an evaluation (its latency as the
host sees it: the launch and its evaluation). `--body` / `--header` build another version
of the kernel's source (the same inputs: rows, settings, u) beside the engine's, so two
forms are timed in one process.
Prints one JSON object.

    python -m bench.gpu.pack_probe [--vocab 49152] [--calls 200] [--body F --header F]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from engine import sampling_candidates
from kernels import cuda, nucleus_pack_cuda


def _build(name: str, body: str, header: str) -> Any:
    return mx.fast.cuda_kernel(  # a name each: MLX keeps a build by its name
        name=f"nucleus_pack_probe_{name}",
        input_names=["rows", "settings", "u"],
        output_names=["packed", "token"],
        source=body,
        header=header,
    )


def _pack(kernel: Any, row: mx.array, params: tuple[mx.array, mx.array]) -> list[mx.array]:
    k = sampling_candidates.K
    return list(
        kernel(
            inputs=[row, *params],
            template=[("K", k)],
            grid=(nucleus_pack_cuda.THREADS, 1, 1),
            threadgroup=(nucleus_pack_cuda.THREADS, 1, 1),
            output_shapes=[(1, 2 * k + 3), (1,)],
            output_dtypes=[mx.float32, mx.uint32],
        )
    )


def _params() -> tuple[mx.array, mx.array]:
    """The kernel's settings [temperature, top_p] and uniform [u]."""
    return mx.array([0.7, 0.95], dtype=mx.float32), mx.array([0.5], dtype=mx.float32)


def _time(kernel: Any, rows: list[mx.array], repeats: int) -> dict[str, float]:
    params = _params()
    mx.eval(*_pack(kernel, rows[0], params))  # compiled, untimed
    batched = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(*[a for row in rows for a in _pack(kernel, row, params)])
        batched.append((time.perf_counter() - t0) / len(rows))
    alone = []
    for row in rows:
        t0 = time.perf_counter()
        mx.eval(*_pack(kernel, row, params))
        alone.append(time.perf_counter() - t0)
    return {
        "batched_us": round(float(np.median(batched)) * 1e6, 1),
        "alone_us": round(float(np.median(alone)) * 1e6, 1),
    }


def run(vocab: int, calls: int, repeats: int, body: str | None, header: str | None) -> dict:
    rng = np.random.default_rng(0)
    rows = [mx.array(rng.normal(0, 3, (1, vocab)).astype(np.float32)) for _ in range(calls)]
    mx.eval(*rows)
    out: dict[str, Any] = {"vocab": vocab, "calls": calls, "k": sampling_candidates.K}
    engine = _build("engine", cuda.source("nucleus_pack.cu"), cuda.source("nucleus_pack.cuh"))
    out["engine"] = _time(engine, rows, repeats)
    if body is not None:
        other = _build("other", body, header or cuda.source("nucleus_pack.cuh"))
        out["other"] = _time(other, rows, repeats)
        params = _params()
        packs = [_pack(kernel, rows[0], params) for kernel in (engine, other)]
        mx.eval(*[a for p in packs for a in p])
        a, b = (np.asarray(p[0])[0] for p in packs)
        k = sampling_candidates.K
        out["same_pack"] = bool(
            np.array_equal(np.sort(a[k : 2 * k]), np.sort(b[k : 2 * k])) and a[-2] == b[-2]
        )
        out["same_token"] = bool(np.asarray(packs[0][1])[0] == np.asarray(packs[1][1])[0])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--body", help="another kernel body to time beside the engine's")
    ap.add_argument("--header", help="its header (default: the engine's)")
    args = ap.parse_args(argv)
    body = Path(args.body).read_text() if args.body else None
    header = Path(args.header).read_text() if args.header else None
    print(json.dumps(run(args.vocab, args.calls, args.repeats, body, header), indent=1))


if __name__ == "__main__":
    main()
