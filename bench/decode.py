"""Decode and prefill speed: ours against llama.cpp and mlx-lm on the default model.

    python -m bench decode [--peers] [--json] [--runs N] [--backend numpy|mlx] [--steps N]
                           [--mlx-lm-runs N]

For each context length C (128, 512, 1024, 2048) every engine starts a fresh sequence,
prefills C tokens of the same prompt (timed: prefill tok/s at C), then runs `steps`
greedy decode steps (timed: decode tok/s at context C). Also the verify cost: a forward of
8 rows with logits for every row, in units of one decode step, at context 128 (what a
speculative verify of 7 drafted tokens costs). Figures are medians over --runs (mlx-lm,
~20x slower here, gets --mlx-lm-runs, default 1); the "spread" section holds min and max.
Results go to results/decode-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import common
from bench.peers import make_peers
from engine.config import EngineConfig

CONTEXTS = (128, 512, 1024, 2048)
VERIFY_ROWS = 8
VERIFY_CONTEXT = 128
PEERS = ("llama_cpp", "mlx_lm")


class OursRunner:
    """Our model's forward on one SequenceState, prefilled in the engine's chunk size."""

    name = "ours"

    def __init__(self, gguf_path: Path, config: EngineConfig) -> None:
        from engine.kv_state import dtype_name
        from engine.loader import load_model
        from engine.session import PREFILL_CHUNK
        from kernels import qmatmul

        self.lm = load_model(gguf_path, config)
        self.runner, self.ops = self.lm.runner, self.lm.ops
        self.state = self.runner.new_state()
        self.chunk = PREFILL_CHUNK
        self.settings = {
            "backend": self.ops.name,
            "prefill_chunk": PREFILL_CHUNK,
            # the C kernel on packed 4/8-bit rows (kernels/qmatmul.py), else float32 BLAS
            "packed_matmul": bool(getattr(self.ops, "packed", False)),
            # how: "int8" (kernels/int8_matmul.py) or "float" (EngineConfig.cpu_matmul)
            "cpu_matmul": getattr(self.ops, "cpu_matmul", None),
            "threads": config.threads or qmatmul.default_num_threads(),
            "kv_dtype": dtype_name(self.ops.kv_dtype),  # BRANCHCHAT_KV_DTYPE
        }

    def _greedy(self, logits: Any) -> int:
        # as the engine's greedy decoding does: the argmax on the device, one int back
        return int(self.ops.argmax_rows(logits)[-1])

    def prefill(self, ids: list[int]) -> int:
        from engine.sequence import prefill

        self.state = self.runner.new_state()
        return self._greedy(prefill(self.runner, self.state, ids, chunk_size=self.chunk))

    def decode(self, token: int) -> int:
        return self._greedy(self.runner.forward([token], self.state))

    def verify(self, rows: int) -> float:
        checkpoint = self.state.checkpoint(record=True)
        t0 = time.perf_counter()
        self.runner.forward([self.state.tokens[-1]] * rows, self.state, logits="all")
        elapsed = time.perf_counter() - t0
        self.state.rollback(checkpoint)
        return elapsed


def measure(runner: Any, ids: list[int], steps: int) -> dict[str, float]:
    """One run of every figure for one engine."""
    out: dict[str, float] = {}
    runner.prefill(ids[:16])  # warm-up: first-call allocations, lazy initialisation
    for context in CONTEXTS:
        t0 = time.perf_counter()
        token = runner.prefill(ids[:context])
        out[f"prefill_tok_s_{context}"] = context / (time.perf_counter() - t0)
        if context == VERIFY_CONTEXT:
            step_s = _mean_step(runner, token, steps)
            out[f"decode_tok_s_{context}"] = 1.0 / step_s
            verify_s = [runner.verify(VERIFY_ROWS) for _ in range(5)]
            if verify_s[0] is not None:
                out[f"verify_{VERIFY_ROWS}_rows_in_decode_steps"] = float(
                    np.median(verify_s) / step_s
                )
            continue
        t0 = time.perf_counter()
        if hasattr(runner, "decode_many"):  # a peer's own generation loop
            token = runner.decode_many(token, steps)
        else:
            for _ in range(steps):
                token = runner.decode(token)
        out[f"decode_tok_s_{context}"] = steps / (time.perf_counter() - t0)
    return out


def _mean_step(runner: Any, token: int, steps: int) -> float:
    if hasattr(runner, "decode_many"):  # a peer's own generation loop
        t0 = time.perf_counter()
        runner.decode_many(token, steps)
        return (time.perf_counter() - t0) / steps
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        token = runner.decode(token)
        times.append(time.perf_counter() - t0)
    # mean over the steps, like the other contexts; the verify ratio divides by it
    return float(np.mean(times))


def run(args: argparse.Namespace, config: EngineConfig) -> dict[str, Any]:
    # the load average and the checkout as the run starts
    common.warn_if_busy()
    machine, versions, date = common.machine(), common.versions(), common.now_iso()
    gguf = common.model_file(args.model)
    ours = OursRunner(gguf, config)
    ids = common.prompt_ids(ours.lm.tokenizer, max(CONTEXTS))
    runners: list[Any] = [ours]
    missing: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.peers:
            mlx_dir = _converted(gguf, Path(tmp))
            peers, missing = make_peers(list(PEERS), gguf, mlx_dir)
            runners += peers
            for name, why in missing.items():
                print(f"{name}: {why}", file=sys.stderr)
        samples: dict[str, list[dict[str, float]]] = {r.name: [] for r in runners}
        for run_index in range(args.runs):
            for runner in runners:  # interleaved, so a burst of load hits every engine
                if runner.name == "mlx_lm" and run_index >= args.mlx_lm_runs:
                    continue
                samples[runner.name].append(measure(runner, ids, args.steps))
                if not args.json:
                    print(f"run {run_index + 1}/{args.runs} {runner.name}: done", file=sys.stderr)
    result: dict[str, Any] = {"command": _command(args), "date": date}
    spread: dict[str, Any] = {}
    for name, runs in samples.items():
        keys = runs[0].keys()
        spread[name] = {k: common.spread([r[k] for r in runs]) for k in keys}
        result[name] = {k: spread[name][k]["median"] for k in keys}
    for name, why in missing.items():
        result[name] = {"missing": why}
    result["ratios"] = {
        name: {k: result["ours"][k] / v for k, v in result[name].items() if k in result["ours"]}
        for name in PEERS
        if name in samples
    }
    result["ratio_meaning"] = (
        "ours / peer: above 1 means ours is faster for tok/s keys; for the verify key, "
        "above 1 means our verify costs more decode steps"
    )
    result["spread"] = spread
    result["settings"] = {
        "steps": args.steps,
        "contexts": list(CONTEXTS),
        **{r.name: r.settings for r in runners},
    }
    result["machine"] = {**machine, "load_average_1m_end": round(os.getloadavg()[0], 2)}
    result["versions"] = versions
    result["model"] = common.model_info(gguf)
    result["runs"] = args.runs
    if "mlx_lm" in samples:
        result["mlx_lm_runs"] = len(samples["mlx_lm"])
    return common.rounded(result)


def _command(args: argparse.Namespace) -> str:
    parts = ["python -m bench decode"]
    if args.peers:
        parts.append("--peers")
    parts += [f"--runs {args.runs}", f"--steps {args.steps}"]
    if args.peers and args.mlx_lm_runs != 1:
        parts.append(f"--mlx-lm-runs {args.mlx_lm_runs}")
    if args.backend:
        parts.append(f"--backend {args.backend}")
    return " ".join(parts)


def print_table(result: dict[str, Any]) -> None:
    engines = [n for n in ("ours", *PEERS) if n in result and "missing" not in result[n]]
    keys = list(result["ours"])
    print(f"{'figure':<34}" + "".join(f"{n:>12}" for n in engines))
    for key in keys:
        row = "".join(
            f"{result[n][key]:>12.2f}" if key in result[n] else f"{'-':>12}" for n in engines
        )
        print(f"{key:<34}{row}")
    for name, ratios in result["ratios"].items():
        shown = ", ".join(f"{k}={v:.2f}" for k, v in ratios.items())
        print(f"ours / {name}: {shown}")
    for name in PEERS:
        if name in result and "missing" in result[name]:
            print(f"{name}: {result[name]['missing']}")


def _converted(gguf: Path, directory: Path) -> Path | None:
    """mlx-lm's copy of the model; None (mlx-lm is left out, saying so) when the GGUF's
    tensor types have no MLX directory form."""
    from engine.errors import EngineError

    try:
        return common.converted_default_model(directory, gguf)
    except EngineError as exc:
        print(f"mlx_lm: cannot convert {gguf.name} ({exc})", file=sys.stderr)
        return None


def main(argv: list[str] | None = None, config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench decode", description=__doc__)
    parser.add_argument(
        "--model", help="a .gguf file or a shipped model's name (default: the default model)"
    )
    parser.add_argument("--peers", action="store_true", help="also run llama.cpp and mlx-lm")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=3, help="runs to take the median of")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per context")
    parser.add_argument("--mlx-lm-runs", type=int, default=1, help="runs for mlx-lm (slow)")
    parser.add_argument("--backend", choices=("numpy", "mlx"), default=None)
    args = parser.parse_args(argv)
    if min(args.runs, args.steps, args.mlx_lm_runs) < 1:
        parser.error("--runs, --steps and --mlx-lm-runs must be >= 1")
    result = run(args, common.engine_config(config, args.backend))
    return common.report("decode", result, args.json, print_table)
