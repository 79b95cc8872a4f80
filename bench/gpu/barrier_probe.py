"""Debug probe: SM count and grid-barrier cost of the one-launch step (GPU only)."""

from __future__ import annotations

import json
import time

import mlx.core as mx

from kernels import fused_step_cuda as fs

SRC = r"""
  for (int i = 0; i < NB; ++i) fs_grid_sync(sync, (i + 1) * gridDim.x);
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = 1.f;
"""


def main() -> None:
    out = {"sm_count": fs.sm_count()}
    k = mx.fast.cuda_kernel(
        name="fs_barrier_probe",
        input_names=["dummy"],
        output_names=["out", "sync"],
        source=SRC,
        header=fs._STEP_HEADER,
    )
    for blocks, nb, size, read in [
        (132, 150, 2, True),
        (132, 150, 16384, True),
        (132, 150, 16384, False),
        (132, 150, 2, False),
        (16, 150, 16384, False),
    ]:
        if True:

            def once():
                o, s = k(
                    inputs=[mx.zeros((1,))],
                    template=[("NB", nb)],
                    grid=(blocks * 256, 1, 1),
                    threadgroup=(256, 1, 1),
                    output_shapes=[(1,), (size,)],
                    output_dtypes=[mx.float32, mx.uint32],
                    init_value=0,
                )
                mx.eval(o, s)
                return int(s[1].item()) if read else 0

            once()
            t0 = time.perf_counter()
            flags = [once() for _ in range(10)]
            key = f"blocks{blocks}_barriers{nb}_sync{size}_hostread{int(read)}"
            out[key + "_ms"] = (time.perf_counter() - t0) * 100
            out[key + "_timeouts"] = sum(flags)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
