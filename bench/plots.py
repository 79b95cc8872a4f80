"""Plots for docs/BENCHMARKS.md, drawn from results JSON files (never from fresh runs).

    python -m bench plots results/decode-<stamp>.json results/edit-<stamp>.json [--out docs]

A decode result gives docs/decode_speed.png (decode and prefill tokens/s against context
length, ours and each peer); an edit result gives docs/edit_ttft.png (time to first token
against edit depth, ours, the hybrid and llama.cpp, with the full prefill marked, and
dashed, the time to go back to the original branch after that edit).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from engine.config import EngineConfig

STYLES = {
    "ours": ("ours", "tab:blue", "o"),
    "hybrid": ("ours, hybrid model", "tab:cyan", "s"),
    "llama_cpp": ("llama.cpp", "tab:orange", "^"),
    "mlx_lm": ("mlx-lm", "tab:green", "D"),
}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "matplotlib is not installed; install the peers extra: pip install -e '.[peers]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(figures: dict[str, Any], prefix: str) -> tuple[list[int], list[float]]:
    points = sorted(
        (int(m.group(1)), float(v))
        for k, v in figures.items()
        if (m := re.fullmatch(rf"{prefix}_(\d+)", k))
    )
    return [p[0] for p in points], [p[1] for p in points]


def decode_plot(result: dict[str, Any], out: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, prefix, title in (
        (axes[0], "decode_tok_s", "Decode (one token per step)"),
        (axes[1], "prefill_tok_s", "Prefill (a fresh prompt)"),
    ):
        for name, (label, color, marker) in STYLES.items():
            figures = result.get(name)
            if not isinstance(figures, dict) or "missing" in figures:
                continue
            xs, ys = _series(figures, prefix)
            if xs:
                ax.plot(xs, ys, marker=marker, color=color, label=label)
        ax.set_xscale("log", base=2)
        contexts = sorted({x for n in STYLES for x in _series(result.get(n) or {}, prefix)[0]})
        ax.set_xticks(contexts, [str(c) for c in contexts])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("tokens / s")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    _caption(fig, result)
    path = out / "decode_speed.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def edit_plot(result: dict[str, Any], out: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    # mlx-lm is left out: ~20x slower here, it would flatten the others (see the tables)
    sources = {"ours": result, "hybrid": result.get("hybrid"), "llama_cpp": result.get("llama_cpp")}
    for name, figures in sources.items():
        if not isinstance(figures, dict) or "depth_curve" not in figures:
            continue
        label, color, marker = STYLES[name]
        curve = figures["depth_curve"]
        edits = [p for p in curve if not p.get("full_prefill")]
        ax.plot(
            [p["depth_tokens"] for p in edits],
            [p["ttft_s"] for p in edits],
            marker=marker,
            color=color,
            label=f"{label}: edit",
        )
        backs = [p for p in edits if "back_ttft_s" in p]
        if backs:
            ax.plot(
                [p["depth_tokens"] for p in backs],
                [p["back_ttft_s"] for p in backs],
                linestyle="--",
                marker="x",
                color=color,
                label=f"{label}: back to the original",
            )
        full = [p for p in curve if p.get("full_prefill")]
        if full:
            ax.scatter(
                [full[0]["depth_tokens"]],
                [full[0]["ttft_s"]],
                marker="*",
                s=160,
                color=color,
                label=f"{label}: full prefill",
            )
    ax.set_xlabel("edit depth (tokens from the edited message to the end)")
    ax.set_ylabel("time to first token (s)")
    ax.set_title(f"Edit a message in a {result['conversation_tokens']}-token conversation")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _caption(fig, result)
    path = out / "edit_ttft.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _caption(fig: Any, result: dict[str, Any]) -> None:
    machine = result.get("machine", {})
    text = (
        f"{result.get('command', '')} · {machine.get('cpu', '?')}, {machine.get('cores', '?')} "
        f"cores · {result.get('date', '')[:10]} · medians of {result.get('runs', '?')} runs"
    )
    fig.text(0.01, -0.02, text, fontsize=7, color="0.4")


def main(argv: list[str] | None = None, config: EngineConfig | None = None) -> int:
    """`config` goes unused: plots only read result files (every benchmark takes one)."""
    parser = argparse.ArgumentParser(prog="python -m bench plots", description=__doc__)
    parser.add_argument("results", nargs="+", type=Path, help="decode-*.json / edit-*.json")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="where PNGs go")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.results:
        result = json.loads(path.read_text())
        if "decode_tok_s_128" in result.get("ours", {}):
            print(f"wrote {decode_plot(result, args.out)}")
        elif "depth_curve" in result:
            print(f"wrote {edit_plot(result, args.out)}")
        else:
            print(f"{path}: neither a decode nor an edit result; skipped", file=sys.stderr)
    return 0
