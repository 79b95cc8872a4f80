"""Deep rollback on a hybrid model: truncate from a snapshot against a full re-prefill.

    python -m bench rollback [--json] [--context N] [--backend numpy|mlx] [--positions K]

A random-weight Qwen3.5-style hybrid (3 Gated DeltaNet : 1 gated attention) is written to a
temporary directory and loaded like a download: on the CPU a small one (hidden 512, 8
layers), on a GPU Qwen3.5-0.8B's true shapes. One state is prefilled to the context (2048
tokens on the CPU, 8192 on a GPU) with the default snapshot policy. Then, on a copy of it
for each of K random earlier positions: truncate there plus the next token's logits,
against a full re-prefill of the same prefix plus the next logits; and on the state
itself: a verify pass of 8 rows, and a retaining rollback keeping 3 of the 8. Figures are
medians; "spread" holds min and max. Results go to results/rollback-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx

from bench import common
from engine.config import EngineConfig

VERIFY_ROWS, KEEP_ROWS = 8, 3
CPU_SHAPES: dict[str, Any] = {
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 1536,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "vocab_size": 32768,
}
GPU_SHAPES: dict[str, Any] = {  # Qwen3.5-0.8B's text model
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "intermediate_size": 3584,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "vocab_size": 248320,
}


def write_model(directory: Path, shapes: dict[str, Any], dtype: Any, seed: int = 0) -> Path:
    """The random hybrid in `shapes`, with a placeholder tokenizer (the bench feeds ids)."""
    from tokenizers import Tokenizer, models

    common.write_random_hybrid(directory, shapes, dtype, seed)
    Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")).save(
        str(directory / "tokenizer.json")
    )
    return directory


def sync(state: Any) -> None:
    """Wait for MLX's lazy work on the state's arrays (a no-op on NumPy), so a timing
    includes it; through the layer protocol, whatever kind each layer is."""
    pending = [a for layer in state.layers for a in layer.live_arrays() if isinstance(a, mx.array)]
    if pending:
        mx.eval(pending)


def run(args: argparse.Namespace, config: EngineConfig) -> dict[str, Any]:
    from engine.loader import load_model
    from engine.sequence import prefill, truncate

    on_gpu = mx.default_device() == mx.gpu
    context = args.context or (8192 if on_gpu else 2048)
    shapes = GPU_SHAPES if on_gpu else CPU_SHAPES
    rng = random.Random(args.seed)
    ids = [rng.randrange(shapes["vocab_size"]) for _ in range(context + VERIFY_ROWS * 16)]
    probe = ids[-1]
    with tempfile.TemporaryDirectory() as tmp:
        dtype = mx.bfloat16 if on_gpu else mx.float32
        loaded = load_model(write_model(Path(tmp) / "hybrid", shapes, dtype), config)
    model = loaded.runner
    chunk = model.prefill_rows

    def truncate_then_next_logits(state: Any, n: int) -> None:
        truncate(model, state, n, chunk_size=chunk)
        model.forward([probe], state)

    def reprefill_then_next_logits(n: int) -> None:
        fresh = model.new_state()
        prefill(model, fresh, ids[:n], chunk_size=chunk)
        model.forward([probe], fresh)

    state = model.new_state()
    build_s = common.timed(lambda: prefill(model, state, ids[:context], chunk_size=chunk))
    say(args, f"prefilled {context} tokens in {build_s:.2f} s")

    positions = sorted(rng.randrange(context // 8, context) for _ in range(args.positions))
    # one untimed round of each first: MLX builds its kernels on first use (~2 s on CUDA)
    truncate_then_next_logits(copy.deepcopy(state, {id(state.ops): state.ops}), positions[0])
    reprefill_then_next_logits(context // 8)
    cp = state.checkpoint(record=True)
    model.forward(ids[context : context + VERIFY_ROWS], state, logits="all")
    state.rollback_retaining(cp, KEEP_ROWS)

    truncate_s, reprefill_s, replayed = [], [], []
    for n in positions:
        clone = copy.deepcopy(state, {id(state.ops): state.ops})  # ops hold MLX dtypes
        replayed.append(n - clone.plan_truncate(n))
        truncate_s.append(common.timed(lambda c=clone, n=n: truncate_then_next_logits(c, n)))
        reprefill_s.append(common.timed(lambda n=n: reprefill_then_next_logits(n)))
        say(
            args,
            f"position {n}: truncate {truncate_s[-1]:.3f} s, re-prefill {reprefill_s[-1]:.3f} s",
        )

    verify_s, retaining_s = [], []
    for run_index in range(args.runs):
        block = ids[context + run_index * VERIFY_ROWS : context + (run_index + 1) * VERIFY_ROWS]
        cp = state.checkpoint(record=True)
        verify_s.append(common.timed(lambda b=block: model.forward(b, state, logits="all")))
        retaining_s.append(
            common.timed(lambda cp=cp: (state.rollback_retaining(cp, KEEP_ROWS), sync(state)))
        )

    figures = {
        "truncate_s": truncate_s,
        "full_reprefill_s": reprefill_s,
        "speedup": [r / t for r, t in zip(reprefill_s, truncate_s, strict=True)],  # per position
        "verify_s": verify_s,
        "retaining_rollback_s": retaining_s,
    }
    return common.rounded(
        {
            "context_tokens": context,
            **{name: common.spread(values)["median"] for name, values in figures.items()},
            "spread": {name: common.spread(values) for name, values in figures.items()},
            "stride": state.policy.stride,
            "positions": positions,
            "replayed_tokens": replayed,
            "verify_rows": VERIFY_ROWS,
            "kept_rows": KEEP_ROWS,
            "build_s": build_s,
            "state_mib": state.nbytes() / 2**20,
            "snapshot_mib": state.snapshot_nbytes() / 2**20,
            "model": {**shapes, "dtype": str(dtype).removeprefix("mlx.core.")},
            "backend": loaded.ops.name,
            "device": str(mx.default_device()),
            "machine": common.machine(),
            "versions": common.versions(),
            "command": "python -m bench rollback " + " ".join(args.argv),
            "date": common.now_iso(),
        }
    )


def say(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        print(text, file=sys.stderr, flush=True)


def print_table(result: dict[str, Any]) -> None:
    spread = result["spread"]
    print(
        f"hybrid, {result['context_tokens']} tokens, snapshot stride {result['stride']}, "
        f"{result['backend']} on {result['device']}"
    )
    print(f"{'figure':<30}{'median':>12}{'min':>12}{'max':>12}")
    for name in ("truncate_s", "full_reprefill_s", "speedup", "verify_s", "retaining_rollback_s"):
        s = spread[name]
        print(f"{name:<30}{s['median']:>12.4g}{s['min']:>12.4g}{s['max']:>12.4g}")
    print(f"replayed tokens per truncate: {result['replayed_tokens']}")


def main(argv: list[str] | None = None, config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench rollback", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--context", type=int, default=0, help="tokens (2048 CPU, 8192 GPU)")
    parser.add_argument("--backend", choices=("numpy", "mlx"), default=None)
    parser.add_argument("--positions", type=int, default=5, help="truncate positions to time")
    parser.add_argument("--runs", type=int, default=5, help="verify + retaining rollbacks")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    result = run(args, common.engine_config(config, args.backend))
    return common.report("rollback", result, args.json, print_table)
