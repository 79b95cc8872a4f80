"""The decode bench's command line: its arguments, their defaults (a full run or --quick)
and the command that reproduces a run."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.busy import fraction

CONTEXTS = (128, 512, 1024, 2048, 4096, 8192)
PASTE_TOKENS = 5000
FULL = {"runs": 3, "steps": 32, "contexts": CONTEXTS, "paste_tokens": PASTE_TOKENS}
QUICK = {"runs": 1, "steps": 8, "contexts": (128, 512), "paste_tokens": 512}


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces the run, every setting spelled out."""
    parts = ["python -m bench decode"]
    if args.model:
        parts.append(f"--model {args.model}")
    if args.peers:
        parts.append("--peers")
    parts += [f"--runs {args.runs}", f"--steps {args.steps}"]
    parts.append("--contexts " + ",".join(str(c) for c in args.contexts))
    parts.append(f"--paste-tokens {args.paste_tokens}")
    if args.llama_bench:
        parts.append(f"--llama-bench {args.llama_bench}")
    if args.peers and args.mlx_lm_runs != 1:
        parts.append(f"--mlx-lm-runs {args.mlx_lm_runs}")
    if args.backend:
        parts.append(f"--backend {args.backend}")
    if args.warmup is not None:
        parts.append(f"--warmup {args.warmup}")
    if args.busy:
        parts.append(f"--busy {args.busy:g}")
    return " ".join(parts)


def parse_contexts(text: str) -> tuple[int, ...]:
    """'128,512,2048' -> (128, 512, 2048): positive, each once, in increasing order."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        message = f"--contexts takes integers like 128,2048: {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--contexts takes positive integers: {text!r}")
    return tuple(sorted(set(values)))


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench decode", description=description)
    parser.add_argument(
        "--model", help="a .gguf file or a shipped model's name (default: the default model)"
    )
    parser.add_argument("--peers", action="store_true", help="also run llama.cpp and mlx-lm")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, help="runs to take the median of (default 3)")
    parser.add_argument("--steps", type=int, help="decode steps per context (default 32)")
    parser.add_argument(
        "--contexts",
        type=parse_contexts,
        default=None,
        help="context lengths, comma-separated (default: 128,512,1024,2048,4096,8192)",
    )
    parser.add_argument(
        "--paste-tokens", type=int, default=None, help="the paste's tokens (default 5000; 0: none)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: contexts 128,512, 1 run, 8 steps, a 512-token paste (each unless given)",
    )
    parser.add_argument("--mlx-lm-runs", type=int, default=1, help="runs for mlx-lm (slow)")
    parser.add_argument("--backend", choices=("numpy", "mlx"), default=None)
    parser.add_argument(
        "--warmup",
        type=int,
        help="uncounted runs of every figure first (default: 1 on a GPU, whose first call of "
        "each shape compiles kernels; 0 on a CPU)",
    )
    parser.add_argument(
        "--bandwidth",
        type=float,
        help="the device's memory bandwidth in bytes/s: each decode figure is also given as "
        "a fraction of what it could feed (bench/roofline.py; default on a GPU: the H200's "
        "4.8e12; on a CPU: none)",
    )
    parser.add_argument(
        "--llama-bench",
        type=Path,
        help="llama.cpp's llama-bench binary (its CUDA build on a GPU) as the llama.cpp peer",
    )
    parser.add_argument(
        "--busy",
        type=fraction,
        default=0.0,
        help="another process takes this fraction of a core while ours measures, in bursts "
        "(bench/busy.py; default 0: none)",
    )
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if min(args.runs, args.steps, args.mlx_lm_runs) < 1:
        parser.error("--runs, --steps and --mlx-lm-runs must be >= 1")
    if args.paste_tokens < 0:
        parser.error("--paste-tokens must be >= 0")
    if args.bandwidth is not None and args.bandwidth <= 0:
        parser.error("--bandwidth must be > 0")
    if args.warmup is not None and args.warmup < 0:
        parser.error("--warmup must be >= 0")
    return args
