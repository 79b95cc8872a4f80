"""Debug probe: where a one-launch step's time goes (GPU only)."""

from __future__ import annotations

import json
import time

import mlx.core as mx
import numpy as np

from bench.gpu.probe import random_model
from kernels.ops import make_ops


def main() -> None:
    model = random_model(make_ops("mlx"))
    model.enable_fused_decode(mode="step")
    f = model.fused
    state = model.new_state()
    model.forward(list(range(128)), state)
    kvs = list(state.layers)
    for kv in kvs:
        kv._grow(4096)
    mx.eval(*[a for kv in kvs for a in (kv.keys, kv.values)])
    ids = mx.array([5], dtype=mx.int32)
    pos = mx.array([128], dtype=mx.int32)
    out = {}

    def timeit(name, fn, n=200):
        for _ in range(10):
            fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t0) / n * 1000

    def call(head_mode):
        return f.step_kernel(
            ids,
            pos,
            f.table,
            f.stacked,
            [kv.keys for kv in kvs],
            [kv.values for kv in kvs],
            head_mode,
        )

    timeit("python_build_only_ms", lambda: call(1))
    timeit("none_eval_ms", lambda: mx.eval(*call(0)))
    timeit("last_eval_ms", lambda: mx.eval(*call(1)))
    timeit("last_eval_status_item_ms", lambda: int(call(1)[1].item()))
    timeit("last_eval_logits_to_numpy_ms", lambda: np.array(call(1)[0]))
    timeit("last_argmax_item_ms", lambda: int(mx.argmax(call(1)[0], axis=-1).item()))
    timeit("new_pos_array_ms", lambda: mx.array([128], dtype=mx.int32))
    timeit("forward_ms", lambda: model.forward([5], state), n=100)
    timeit("forward_to_numpy_ms", lambda: np.array(model.forward([5], state)), n=100)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
