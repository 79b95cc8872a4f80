"""Where a GPU prefill forward's time goes: python -m bench.gpu.forward_probe (on the H200,
the default model fetched). A forward of R rows on an empty state, best of --runs, for
several R (its fixed part is what a short prompt pays); the time of each op of layer 0 at
--rows rows alone, evaluated op by op; and the host cost of one small MLX op (a chain of
600 additions, evaluated once). Then the same forwards with each layer's output handed to
`mx.async_eval` as it is built (`pipelined_forward_ms`), so the GPU runs layer i while
Python builds layer i + 1 (`MlxOps.overlap_layers`): whether that hides the graph's host
time is what it measures. Prints one JSON object and writes it to --out.
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


def best_ms(fn: Any, runs: int) -> float:
    fn()
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("forward_probe.json"))
    args = parser.parse_args()
    config = replace(EngineConfig.from_environment(), backend="mlx")  # BRANCHCHAT_GPU_MATMUL
    runner = load_model(default_model_path(), config).runner
    ops, model = runner.ops, runner.model
    result: dict[str, Any] = {"device": str(mx.default_device()), "forward_ms": {}}

    def forward(rows: int, logits: str) -> None:
        state = runner.new_state()
        out = model.forward([7] * rows, state, logits=logits)
        mx.eval(out) if out is not None else mx.eval(state.layers[-1].keys)

    for rows in (1, 16, 64, 256, 512, 1024, 2048):
        result["forward_ms"][rows] = {
            "last": round(best_ms(lambda r=rows: forward(r, "last"), args.runs), 3),
            "none": round(best_ms(lambda r=rows: forward(r, "none"), args.runs), 3),
        }
    ops.overlap_layers = True
    try:
        result["pipelined_forward_ms"] = {
            rows: round(best_ms(lambda r=rows: forward(r, "last"), args.runs), 3)
            for rows in (1, 16, 64, 256, 512, 1024, 2048)
        }
    finally:
        ops.overlap_layers = False
    one = mx.zeros((4,))
    mx.eval(one)

    def chain() -> None:
        y = one
        for _ in range(600):
            y = y + 1
        mx.eval(y)

    result["host_us_per_op"] = round(best_ms(chain, args.runs) / 600 * 1e3, 2)
    layer, R = model.layers[0], args.rows
    cfg = model.config
    x = mx.random.normal((R, cfg.hidden_size)).astype(mx.float32)
    h = mx.random.normal((R, cfg.intermediate_size)).astype(mx.float32)
    q = mx.random.normal((cfg.num_heads, R, cfg.head_dim)).astype(ops.dtype)
    kv = mx.random.normal((cfg.num_kv_heads, R, cfg.head_dim)).astype(ops.dtype)
    mixer, mlp = layer.mixer, layer.mlp

    def timed(fn: Any) -> float:
        return round(best_ms(lambda: mx.eval(fn()), args.runs * 4), 4)

    result["layer0_ms_at_rows"] = R
    result["layer0_ms"] = {
        "rms_norm": timed(lambda: ops.rms_norm(x, layer.input_norm, cfg.rms_norm_eps)),
        "qkv": timed(lambda: ops.linear(x, mixer.qkv.w)),
        "o": timed(lambda: ops.linear(x, mixer.o.w)),
        "gate_up": timed(lambda: ops.linear(x, mlp.gate_up.w)),
        "down": timed(lambda: ops.linear(h, mlp.down.w)),
        "silu_mul": timed(lambda: ops.silu(h) * h),
        "rope": timed(lambda: ops.rope(q, 0, cfg.head_dim, cfg.rope_theta, cfg.rope_traditional)),
        "attention_causal": timed(
            lambda: mx.fast.scaled_dot_product_attention(
                q[None], kv[None], kv[None], scale=0.125, mask="causal"
            )
        ),
        "head_last_row": timed(lambda: model.logits(x[-1:])),
    }
    text = json.dumps(result, indent=1)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
