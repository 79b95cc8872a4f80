"""What a float32 matrix product is on MLX's default device: its error against float64,
in units of float32's and TF32's unit roundoff (2^-24, 2^-11). Run with and without
MLX_ENABLE_TF32=0 set, on the GPU machine (tools/gpu/device_suite.sh)."""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np

rng = np.random.default_rng(0)
a, b = rng.standard_normal((512, 2048)), rng.standard_normal((2048, 512))
want = a @ b
got = np.array(mx.array(a.astype(np.float32)) @ mx.array(b.astype(np.float32)))
error = float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2)))
print(
    f"MLX_ENABLE_TF32={os.environ.get('MLX_ENABLE_TF32', '(unset)')} on {mx.default_device()}:"
    f" float32 matmul relative RMS error {error:.3g}"
    f" = {error / 2**-24:.3g} u(float32) = {error / 2**-11:.3g} u(tf32)"
)
