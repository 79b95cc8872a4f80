"""On the H200: MLX's quantized matmul and its embedding gather against dequantize-then-
matmul, for the shapes of the tiny test models (hidden 64 = one group of 64 a row), with
the time of each call. Prints one line a case; the failing group-64 test's shapes first."""

from __future__ import annotations

import sys
import time

import mlx.core as mx
import numpy as np

rng = np.random.default_rng(0)


def case(rows: int, n: int, k: int, group: int, bits: int, dtype: mx.Dtype) -> None:
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32) * 0.1)
    packed, scales, biases = mx.quantize(w, group_size=group, bits=bits)
    scales, biases = scales.astype(dtype), biases.astype(dtype)
    x = mx.array(rng.standard_normal((rows, k)).astype(np.float32)).astype(dtype)
    dense = mx.dequantize(packed, scales, biases, group_size=group, bits=bits)
    want = x.astype(mx.float32) @ dense.astype(mx.float32).T
    mx.eval(want)
    t0 = time.perf_counter()
    got = mx.quantized_matmul(
        x, packed, scales, biases, transpose=True, group_size=group, bits=bits
    )
    mx.eval(got)
    dt = time.perf_counter() - t0
    err = float(mx.max(mx.abs(got.astype(mx.float32) - want)))
    scale = float(mx.max(mx.abs(want)))
    ids = mx.array(rng.integers(0, n, rows).astype(np.int32))
    emb = mx.dequantize(packed[ids], scales[ids], biases[ids], group_size=group, bits=bits)
    emb_err = float(mx.max(mx.abs(emb.astype(mx.float32) - dense[ids].astype(mx.float32))))
    print(
        f"rows {rows:3d} n {n:5d} k {k:4d} g {group:3d} b {bits} {str(dtype):14s} "
        f"qmm err {err:.3g} (of {scale:.3g}) {dt * 1e3:8.1f} ms  gather err {emb_err:.3g}",
        flush=True,
    )


print(mx.__version__, mx.default_device(), flush=True)
# rows above one take the matrix kernel; K == group (one group a row) was wrong there
shapes = [
    (8, 64, 128, 64, 4),
    (8, 64, 256, 64, 4),
    (8, 128, 128, 64, 8),
    (40, 64, 128, 64, 4),
    (8, 64, 576, 64, 4),
    (8, 64, 64, 64, 4),
]
for dtype in (mx.float32, mx.bfloat16):
    for rows, n, k, group, bits in shapes:
        case(rows, n, k, group, bits, dtype)
sys.exit(0)
