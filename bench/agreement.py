"""Teacher-forced agreement with a float64 reference: python -m bench agreement

Each real model with fixtures in tests/oracles/fixtures/real/ (the default model; Gemma 3
270M where its file is present) reads the fixture's 1,000 tokens of tests/oracles/text.txt
teacher-forced, and every position is compared with transformers' float64 forward of the
same GGUF: top-1 agreement (argmax equal) and mean KL(float64 || ours), lumped over
float64's top 64 ids (tests/oracles/topk_stats.py: a lower bound of the full KL, the same
partition for every row). The row to match is llama.cpp on the CPU (llama-cpp-python,
measured on the same tokens when the fixtures were made, tests/oracles/make_real.py).

Paths, each where this machine has it: numpy (ours on the CPU, float32), mlx-default
(MLX's default dtype on its default device: bfloat16 on a GPU) and mlx-float32; each in
two modes: prefill (forwards of 256 rows, the plain path) and decode (one row per forward:
on a GPU the fused kernels, where the model takes them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import common
from engine.config import EngineConfig
from engine.default_model import default_model_path
from engine.loader import load_model
from tests.oracles import topk_stats
from tests.oracles.fixture_files import MANIFEST, real_reference

PATHS = {"numpy": ("numpy", None), "mlx-default": ("mlx", None), "mlx-float32": ("mlx", "float32")}
MODES = {"prefill": 256, "decode": 1}  # rows per forward


def model_path(name: str, given: dict[str, Path]) -> Path | None:
    """The fixture's GGUF: --model NAME=PATH, else where the engine keeps it."""
    if name in given:
        return given[name]
    if name == "smollm2":
        return default_model_path()
    try:
        from engine.model_catalog import catalog_entry
    except ImportError:
        return None
    entry = catalog_entry("gemma3-270m")
    return entry.path() if entry is not None else None


def checked(name: str, path: Path | None) -> str | None:
    """Why the file can't be measured against the fixture, or None."""
    if path is None or not path.is_file():
        return f"the model file is absent ({path})"
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    if digest.hexdigest() != MANIFEST["real_models"][name]["sha256"]:
        return f"{path} is not the file the fixtures were made from"
    return None


def measure(name: str, path: Path, args: argparse.Namespace, base: EngineConfig) -> dict:
    # every fixture array is per position: the first --positions of each, for a quick look
    ref = {key: value[: args.positions or None] for key, value in real_reference(name).items()}
    paths, modes = args.paths, args.modes
    ids = [int(t) for t in ref["ids"]]
    llama_cpp = topk_stats.figures(
        ref, ref["llama_cpp_argmax"], ref["llama_cpp_lse"], ref["llama_cpp_at_f64_top"]
    )
    out: dict[str, Any] = {"num_positions": len(ids), "llama_cpp_cpu": llama_cpp, "ours": {}}
    for label in paths:
        backend, dtype = PATHS[label]
        runner = load_model(path, replace(base, backend=backend, dtype=dtype)).runner
        ours: dict[str, Any] = {"compute_dtype": str(getattr(runner.ops, "dtype", "float32"))}
        for mode in modes:
            began = time.perf_counter()
            got = topk_stats.figures(
                ref, **topk_stats.teacher_forced(runner, ids, ref["f64_top_ids"], MODES[mode])
            )
            ours[mode] = {**got, "seconds": round(time.perf_counter() - began, 2)}
            # as each path ends: a run cut short by a time limit still says what it measured
            print(f"{name} {label} {mode}: {json.dumps(ours[mode])}", file=sys.stderr, flush=True)
        out["ours"][label] = ours
    return out


def run(args: argparse.Namespace, config: EngineConfig) -> dict[str, Any]:
    import mlx.core as mx

    given = dict(_named_path(text) for text in args.model)
    result: dict[str, Any] = {
        "bench": "agreement",
        "argv": args.argv,
        "date": common.now_iso(),
        "machine": common.machine(),
        "versions": common.versions(),
        "mlx_device": str(mx.default_device()),
        "text": "tests/oracles/text.txt (its first 1,000 tokens, as the fixtures hold them)",
        "models": {},
    }
    for name in args.names:
        path = model_path(name, given)
        reason = checked(name, path)
        if reason is not None:
            print(f"{name}: left out, {reason}", file=sys.stderr)
            result["models"][name] = {"left_out": reason}
            continue
        assert path is not None  # checked() said it is a file
        result["models"][name] = measure(name, path, args, config)
    return result


def _named_path(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or name not in MANIFEST["real_models"]:
        raise SystemExit(f"--model takes NAME=PATH with NAME in {sorted(MANIFEST['real_models'])}")
    return name, Path(path).expanduser()


def print_table(result: dict[str, Any]) -> None:
    print(f"teacher-forced against float64, MLX on {result['mlx_device']}")
    for name, entry in result["models"].items():
        if "left_out" in entry:
            print(f"{name}: left out ({entry['left_out']})")
            continue
        print(f"{name}, {entry['num_positions']} positions   top-1   mean KL    p99 KL")
        rows = [("llama.cpp CPU", entry["llama_cpp_cpu"])]
        for label, ours in entry["ours"].items():
            rows += [(f"{label} {mode}", ours[mode]) for mode in ours if mode in MODES]
        for label, f in rows:
            kl, p99 = f["mean_kl_vs_f64"], f["p99_kl_vs_f64"]
            print(f"  {label:22s} {f['top1_vs_f64']:6.3f}  {kl:.2e}  {p99:.2e}")


def main(argv: list[str] | None = None, config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench agreement", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--names", nargs="+", default=sorted(MANIFEST["real_models"]))
    parser.add_argument("--paths", nargs="+", choices=sorted(PATHS), default=sorted(PATHS))
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=sorted(MODES))
    parser.add_argument("--positions", type=int, default=0, help="the first N (0: all)")
    parser.add_argument("--model", action="append", default=[], help="NAME=PATH of a GGUF")
    parser.add_argument("--out", type=Path, default=None, help="results folder (results/)")
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    result = run(args, common.engine_config(config, None))
    path = common.write_results("agreement", result, args.out or common.RESULTS_DIR)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
        print(f"wrote {path}")
    return 0
