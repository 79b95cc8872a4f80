"""Where a prefill's time goes, for any model the engine loads (a hybrid's first: its
prefill is the one furthest behind llama.cpp on the GPU). For each prompt length R and
each way a prefill chunk may run the Gated DeltaNet rows (`MlxOps.gdn_prefill`: the
chunked form, and on CUDA the one-launch recurrence), on an empty state:

- `cold_ms`: the first forward of R rows (every kernel and cuDNN graph of that shape is
  built inside it, as a user's first prompt of that length pays);
- `new_length_ms`: then a forward of R + 1 rows (the kernels built, the length new);
- `warm_ms`: the best of --runs forwards of R rows;
- `build_ms` / `eval_ms`: the same warm forward split into Python building the lazy graph
  and the device evaluating it (the host's share is what MLX's ~10 us an operation costs);
- `layers`: each layer run and evaluated alone, build and eval summed by the layer's
  mixer kind (`GatedDeltaNet`, `AttentionBlock`, ...), so a kind's share is visible.

For a hybrid, `gdn_kernel` times the recurrence alone at each length in the first Gated
DeltaNet layer's shape (random inputs, warm, best of --runs): the chunked form at chunk
sizes 32-256 (the engine's is 64; fewer chunks, fewer operations in its Python loop) and
the CUDA recurrence with 1, 2, 4 and 8 threads a value column
(`gated_delta_cuda.PREFILL_PAIR`), as the replay's kernel and as the prefill's that
fetches a row ahead (`PREFILL_PREFETCH`), each with its largest output difference from
the chunk-64 form's. `gdn_in_model` times the recurrence as a forward calls it, on the
inputs the first Gated DeltaNet layer hands it at each length (the way `gdn_prefill`
names), beside the same inputs copied into fresh arrays of their dtype and of float32, so
a cost that only the model's own inputs bring (their layout, their dtype) shows.

`attention` times one attention call in the model's first attention shape (bfloat16 K/V
on a GPU) for lengths it has not met, each the first time and again: MLX's causal kernel
(on CUDA, a cuDNN graph built for every new (query rows, key rows)), the same with a bool
mask array, the plain matmuls (`kernels.few_query_attention`), and the masked call on
rows and keys padded up to buckets (so that lengths in one bucket share a shape).
On CUDA it also times the one-launch prefill attention (`kernel`,
`kernels/prefill_attention_cuda.py`: its tensor-core body for half-precision K/V of head
size 64 or 128) and that kernel's scalar float32 body (`kernel_scalar`). For the forwards
above, `--attention cudnn` sends every prefill chunk to MLX's kernel (the engine before
MAX_SCORES), `--attention matmul` every one to the matmuls and `--attention kernel` every
causal one to the one-launch kernel; the default is the engine's rule
(`kernels.few_query_attention.takes`).

Prints one JSON object and writes it to --out.

    python -m bench.gpu.prefill_split --model PATH [--rows 128 512 2048] [--runs 3]
        [--attention engine|cudnn|matmul|kernel]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from engine.config import EngineConfig
from engine.default_model import default_model_path
from engine.loader import load_model
from kernels import few_query_attention, gated_delta_cuda, gated_delta_mlx, prefill_attention_cuda

BUCKET_ROWS, BUCKET_KEYS = 128, 256


def _ids(vocab: int, rows: int) -> np.ndarray:
    return np.random.default_rng(rows).integers(0, vocab, rows, dtype=np.int64)


def forward(runner: Any, ids: np.ndarray) -> tuple[float, float, mx.array]:
    """(build s, eval s, the last row's logits) of one forward of `ids` on a fresh state."""
    model, state = runner.model, runner.new_state()
    offset = state.begin_forward(len(ids))
    try:
        t0 = time.perf_counter()
        out = model.logits(model.hidden(ids, state.layers, offset)[-1:])
        t1 = time.perf_counter()
        mx.eval(out)
        return t1 - t0, time.perf_counter() - t1, out
    finally:
        state.abort_forward()


def _timed_forward(runner: Any, ids: np.ndarray) -> tuple[float, float]:
    return forward(runner, ids)[:2]


def layers(runner: Any, ids: np.ndarray) -> dict[str, dict[str, float]]:
    """Each layer built and evaluated alone (one fresh state), summed by mixer kind, ms."""
    model, state = runner.model, runner.new_state()
    offset = state.begin_forward(len(ids))
    kinds: dict[str, dict[str, float]] = {}
    try:
        x = model.ops.embed(model.embed, ids) * model.config.embed_scale
        mx.eval(x)
        for layer, layer_state in zip(model.layers, state.layers, strict=True):
            t0 = time.perf_counter()
            x = layer(x, layer_state, offset)
            t1 = time.perf_counter()
            mx.eval(x, *layer_state.live_arrays())
            t2 = time.perf_counter()
            kind = kinds.setdefault(
                type(layer.mixer).__name__, {"layers": 0, "build_ms": 0.0, "eval_ms": 0.0}
            )
            kind["layers"] += 1
            kind["build_ms"] += (t1 - t0) * 1e3
            kind["eval_ms"] += (t2 - t1) * 1e3
    finally:
        state.abort_forward()
    return {k: {n: round(v, 3) for n, v in d.items()} for k, d in kinds.items()}


def _captured(runner: Any, ids: np.ndarray) -> tuple[mx.array, ...] | None:
    """The first Gated DeltaNet layer's prefill recurrence inputs (q, k, v, g, beta, state)
    in a forward of `ids`, evaluated; None where no chunk calls it (short rows, no GDN)."""
    ops, seen = runner.model.ops, []
    original = ops.gated_delta_chunked

    def capture(*args: mx.array) -> Any:
        if not seen:  # the first layer's; the others' are left to the forward
            seen.append(args)
        return original(*args)

    ops.gated_delta_chunked = capture  # an instance attribute over the method, until finally
    try:
        forward(runner, ids)
    finally:
        del ops.gated_delta_chunked
    if not seen:
        return None
    mx.eval(*seen[0])
    return tuple(seen[0])


def gdn_in_model(runner: Any, ids: np.ndarray, runs: int) -> dict[str, Any] | None:
    """The prefill recurrence on a forward's own inputs, and on copies of them, ms."""
    args = _captured(runner, ids)
    if args is None:
        return None
    ops = runner.model.ops
    ways = {
        "as_forwarded": args,
        "copies": tuple(x + mx.array(0, dtype=x.dtype) for x in args),
        "float32_copies": tuple(x.astype(mx.float32) + 0.0 for x in args),
    }
    out: dict[str, Any] = {"dtypes": [str(x.dtype) for x in args]}
    for name, inputs in ways.items():
        mx.eval(*inputs)
        best = float("inf")
        for _ in range(runs + 1):  # the first builds the kernel for these dtypes
            t0 = time.perf_counter()
            mx.eval(*ops.gated_delta_chunked(*inputs))
            best = min(best, time.perf_counter() - t0)
        out[f"{name}_ms"] = round(best * 1e3, 3)
    return out


def _length(runner: Any, rows: int, runs: int) -> dict[str, Any]:
    vocab = runner.model.config.vocab_size
    ids = _ids(vocab, rows)
    cold = sum(_timed_forward(runner, ids))
    new_length = sum(_timed_forward(runner, _ids(vocab, rows + 1)))
    warm = min((_timed_forward(runner, ids) for _ in range(runs)), key=sum)
    return {
        "cold_ms": round(cold * 1e3, 3),
        "new_length_ms": round(new_length * 1e3, 3),
        "warm_ms": round(sum(warm) * 1e3, 3),
        "warm_tok_s": round(rows / sum(warm), 1),
        "build_ms": round(warm[0] * 1e3, 3),
        "eval_ms": round(warm[1] * 1e3, 3),
        "layers": layers(runner, ids),
        "gdn_in_model": gdn_in_model(runner, ids, runs),
    }


def gdn_kernel(mixer: Any, rows: int, runs: int) -> dict[str, dict[str, float]]:
    """The Gated DeltaNet recurrence alone at `rows` rows in `mixer`'s shape, ms."""
    H, Dk, Dv = mixer.nv, mixer.dk, mixer.dv
    key = mx.random.key(rows)
    q, k, v = (
        mx.random.normal((rows, H, d), key=mx.random.split(key, 3)[i])
        for i, d in enumerate((Dk, Dk, Dv))
    )
    q, k = (x / mx.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    g = -mx.random.uniform(0.0, 0.5, (rows, H))
    beta = mx.random.uniform(0.0, 1.0, (rows, H))
    state = mx.zeros((H, Dk, Dv))
    mx.eval(q, k, v, g, beta, state)
    kernels = {
        f"chunked_{c}": lambda c=c: gated_delta_mlx.gated_delta_chunked(q, k, v, g, beta, state, c)
        for c in (32, 64, 128, 256)
    }
    if gated_delta_cuda.is_available():  # at each number of threads a value column
        for p in (1, 2, 4, 8):
            for name, ahead in (("recurrent", False), ("prefetch", True)):
                kernels[f"{name}_cuda_p{p}"] = lambda p=p, a=ahead: (
                    gated_delta_cuda.gated_delta_recurrent(q, k, v, g, beta, state, p, a)
                )
    reference = kernels["chunked_64"]()[0]
    out: dict[str, dict[str, float]] = {}
    for name, fn in kernels.items():
        best = float("inf")
        for _ in range(runs + 1):  # the first builds the kernels
            t0 = time.perf_counter()
            o, s = fn()
            mx.eval(o, s)
            best = min(best, time.perf_counter() - t0)
        out[name] = {"ms": round(best * 1e3, 3), "max_diff": float(mx.abs(o - reference).max())}
    return out


def _bucketed(q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
    """Causal attention with rows and keys padded to buckets and the pad masked away."""
    L, S = int(q.shape[2]), int(k.shape[2])
    Lp, Sp = -(-L // BUCKET_ROWS) * BUCKET_ROWS, -(-S // BUCKET_KEYS) * BUCKET_KEYS
    q = mx.pad(q, [(0, 0), (0, 0), (0, Lp - L), (0, 0)])
    k, v = (mx.pad(x, [(0, 0), (0, 0), (0, Sp - S), (0, 0)]) for x in (k, v))
    keys, rows = mx.arange(Sp)[None, :], mx.arange(Lp)[:, None]
    mask = (keys <= rows + (S - L)) & (keys < S)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)[:, :, :L]


def attention(cfg: Any, dtype: Any, pairs: list[tuple[int, int]]) -> dict[str, Any]:
    """One attention call in the model's shape for each (rows, keys) pair, each new: ms the
    first time and the second, and the largest difference from the causal kernel's."""
    H, KVH, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    scale = Dh**-0.5

    ways = {
        "causal": lambda q, k, v: mx.fast.scaled_dot_product_attention(
            q, k, v, scale=scale, mask="causal"
        ),
        "bool_mask": lambda q, k, v: mx.fast.scaled_dot_product_attention(
            q, k, v, scale=scale, mask=few_query_attention.causal_mask(q.shape[2], k.shape[2])
        ),
        "matmul": lambda q, k, v: few_query_attention.few_query_attention(q, k, v, scale, "causal"),
        "bucketed": lambda q, k, v: _bucketed(q, k, v, scale),
    }
    if prefill_attention_cuda.is_available() and prefill_attention_cuda.takes(
        mx.zeros((1, H, 1, Dh)), mx.zeros((1, KVH, 1, Dh))
    ):
        ways["kernel"] = lambda q, k, v: prefill_attention_cuda.prefill_attention(q, k, v, scale)
        ways["kernel_scalar"] = lambda q, k, v: prefill_attention_cuda.prefill_attention(
            q, k, v, scale, tensor_cores=False
        )
    out: dict[str, Any] = {}
    for L, S in pairs:
        key = mx.random.split(mx.random.key(L * 7919 + S), 3)
        q = mx.random.normal((1, H, L, Dh), key=key[0]).astype(dtype)
        k, v = (mx.random.normal((1, KVH, S, Dh), key=key[i]).astype(dtype) for i in (1, 2))
        mx.eval(q, k, v)
        row: dict[str, Any] = {}
        reference = None
        for name, fn in ways.items():
            times = []
            for _ in range(2):
                t0 = time.perf_counter()
                o = fn(q, k, v)
                mx.eval(o)
                times.append(round((time.perf_counter() - t0) * 1e3, 3))
            o = o.astype(mx.float32)
            reference = o if reference is None else reference
            row[name] = {
                "first_ms": times[0],
                "again_ms": times[1],
                "max_diff": float(mx.abs(o - reference).max()),
            }
        out[f"{L}x{S}"] = row
    return out


PAIRS = [(300, 300), (310, 310), (330, 460), (100, 1100), (120, 1130), (2000, 2000)]


def probe(
    model: Path, rows: list[int], runs: int, pairs: list[tuple[int, int]] = PAIRS
) -> dict[str, Any]:
    # no warm-up at load: `cold_ms` is the first forward, the kernels' builds inside it
    config = replace(EngineConfig.from_environment(), backend="mlx", warm_up=False)
    runner = load_model(model, config).runner
    ops = runner.ops
    hybrid = any(type(layer.mixer).__name__ == "GatedDeltaNet" for layer in runner.model.layers)
    # a model without Gated DeltaNet layers is filed under "chunked" whatever the setting
    # (it reads none), so a round's summary finds it there on every device
    modes = ["chunked"]
    if hybrid and gated_delta_cuda.is_available():
        modes = ["chunked", "recurrent"]
    result: dict[str, Any] = {
        "device": str(mx.default_device()),
        "max_scores": few_query_attention.MAX_SCORES,
        "prefill_attention_kernel": prefill_attention_cuda.ENABLED,
        "model": model.name,
        "runs": runs,
        "prefill_rows": runner.prefill_rows,
        "gdn_prefill": {},
    }
    for mode in modes:
        ops.gdn_prefill = mode
        result["gdn_prefill"][mode] = {str(r): _length(runner, r, runs) for r in rows}
    if hybrid:
        mixer = next(
            m
            for m in (layer.mixer for layer in runner.model.layers)
            if type(m).__name__ == "GatedDeltaNet"
        )
        result["gdn_kernel"] = {str(r): gdn_kernel(mixer, r, runs) for r in rows}
    result["attention"] = attention(runner.model.config, ops.dtype, pairs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--rows", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("prefill_split.json"))
    ways = ("engine", "cudnn", "matmul", "kernel")
    parser.add_argument("--attention", choices=ways, default="engine")
    args = parser.parse_args()
    if args.attention in ("cudnn", "matmul"):  # more than 32 rows: cuDNN's, or the matmuls
        few_query_attention.MAX_SCORES = 0 if args.attention == "cudnn" else 1 << 62
    if args.attention == "kernel":  # every causal chunk through the one-launch kernel
        prefill_attention_cuda.ENABLED = True
    result = probe(args.model or default_model_path(), args.rows, args.runs)
    text = json.dumps(result, indent=1)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
