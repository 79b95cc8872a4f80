"""The decode bench's figures from its samples: medians, llama.cpp's best setting per
figure, ratios against each peer, the issues' targets (21 on a CPU, 15 on a GPU), and the
printed tables.

Samples are keyed by (engine, setting): ("ours", ""), ("llama_cpp", "flash_attn=off"),
("llama_cpp", "flash_attn=on"), ("mlx_lm", ""). An engine run under several settings
reports, per figure, the median of its best setting, and names that setting.
"""

from __future__ import annotations

from typing import Any

from bench import common

VERIFY_ROWS = 8
VERIFY_KEY = f"verify_{VERIFY_ROWS}_rows_in_decode_steps"
PEER_ORDER = ("llama_cpp", "mlx_lm")
# the issues' "done when", per figure: (peer, ours / peer at least). Issue 21 on a CPU;
# issue 15 on a GPU (against llama.cpp's CUDA build and mlx-lm). The verify of 8 rows at
# most 2 of our own decode steps on both.
CPU_TARGETS = {
    **{f"decode_tok_s_{c}": (("llama_cpp", 1.2),) for c in (128, 2048, 8192)},
    **{f"prefill_tok_s_{c}": (("llama_cpp", 1.5),) for c in (512, 2048, 8192)},
}
GPU_TARGETS = {
    **{f"decode_tok_s_{c}": (("llama_cpp", 1.0), ("mlx_lm", 2.0)) for c in (128, 2048, 8192)},
    **{f"prefill_tok_s_{c}": (("llama_cpp", 1.0), ("mlx_lm", 1.5)) for c in (512, 1024, 2048)},
}
VERIFY_TARGET_STEPS = 2.0


def higher_is_better(key: str) -> bool:
    """tok/s figures: higher is better; a cost in decode steps: lower is better."""
    return not key.endswith("_in_decode_steps")


def best_of(by_setting: dict[str, dict[str, float]]) -> tuple[dict[str, float], dict[str, str]]:
    """Per figure, the best value over the settings and the setting that gave it (the
    first setting listed wins a tie)."""
    best: dict[str, float] = {}
    chosen: dict[str, str] = {}
    for setting, figures in by_setting.items():
        for key, value in figures.items():
            if key not in best or (
                value > best[key] if higher_is_better(key) else value < best[key]
            ):
                best[key], chosen[key] = value, setting
    return best, chosen


def summarize(
    samples: dict[tuple[str, str], list[dict[str, float]]],
    missing: dict[str, str],
    gpu: bool = False,
) -> dict[str, Any]:
    """Medians per engine (the best setting's for an engine run under several), the
    ratios ours / peer for every figure both have, and the spread of every sample set."""
    spread: dict[str, Any] = {}
    medians: dict[str, dict[str, dict[str, float]]] = {}
    for (name, setting), runs in samples.items():
        label = f"{name}[{setting}]" if setting else name
        spread[label] = {k: common.spread([r[k] for r in runs]) for k in runs[0]}
        medians.setdefault(name, {})[setting] = {k: v["median"] for k, v in spread[label].items()}
    result: dict[str, Any] = {}
    for name, by_setting in medians.items():
        if len(by_setting) == 1:
            result[name] = next(iter(by_setting.values()))
            continue
        result[name], result[f"{name}_setting"] = best_of(by_setting)
        result[f"{name}_by_setting"] = by_setting
    for name, why in missing.items():
        result[name] = {"missing": why}
    ours = result["ours"]
    result["ratios"] = {
        name: {k: ours[k] / v for k, v in result[name].items() if k in ours}
        for name in PEER_ORDER
        if name in medians
    }
    result["ratio_meaning"] = (
        "ours / peer: above 1 means ours is faster for tok/s keys; for the verify key, "
        "above 1 means our verify costs more decode steps"
    )
    result["targets"] = targets(ours, result["ratios"], GPU_TARGETS if gpu else CPU_TARGETS)
    result["targets_issue"] = 15 if gpu else 21
    result["spread"] = spread
    return result


def targets(
    ours: dict[str, float], ratios: dict[str, dict[str, float]], wanted: dict[str, Any]
) -> dict[str, Any]:
    """The targets this run measured: the figure, the target and whether met."""
    out: dict[str, Any] = {}
    for key, bounds in wanted.items():
        for peer, target in bounds:
            if key in ratios.get(peer, {}):
                ratio = ratios[peer][key]
                out[f"{key}_vs_{peer}"] = {
                    "ratio": ratio,
                    "at_least": target,
                    "met": ratio >= target,
                }
    if VERIFY_KEY in ours:
        steps = ours[VERIFY_KEY]
        out[VERIFY_KEY] = {
            "steps": steps,
            "at_most": VERIFY_TARGET_STEPS,
            "met": steps <= VERIFY_TARGET_STEPS,
        }
    return out


def _figure_contexts(result: dict[str, Any], prefix: str) -> list[int]:
    return sorted(int(k[len(prefix) :]) for k in result["ours"] if k.startswith(prefix))


def print_table(result: dict[str, Any]) -> None:
    """One table per figure kind (prefill, decode): a row per context, a column per
    engine and a ratio column per peer; then the paste, the verify cost and the targets."""
    peers = [n for n in PEER_ORDER if n in result and "missing" not in result[n]]
    setting = result.get("llama_cpp_setting", {})
    for kind in ("prefill", "decode"):
        prefix = f"{kind}_tok_s_"
        header = f"{kind + ' tok/s':<16}{'ours':>9}"
        for peer in peers:
            header += f"{peer:>11}{'ratio':>7}"
        print(header + ("  llama.cpp setting" if setting else ""))
        for context in _figure_contexts(result, prefix):
            key = f"{prefix}{context}"
            print(_row(f"context {context}", key, result, peers, setting))
        print()
    for key in result["ours"]:
        if key.startswith("paste_prefill_tok_s_"):
            print(_row("paste " + key.rsplit("_", 1)[1] + " tokens", key, result, peers, setting))
    if VERIFY_KEY in result["ours"]:
        print(f"verify of {VERIFY_ROWS} rows: {result['ours'][VERIFY_KEY]:.2f} decode steps (ours)")
    if "roofline" in result:
        print_roofline(result["roofline"])
    if result.get("targets"):
        print(f"targets of issue {result.get('targets_issue', 21)}:")
    for key, target in result.get("targets", {}).items():
        bound = f">= {target['at_least']}" if "at_least" in target else f"<= {target['at_most']}"
        value = target.get("ratio", target.get("steps"))
        print(f"target {key}: {value:.2f} {bound}: {'met' if target['met'] else 'NOT met'}")
    for name in PEER_ORDER:
        if name in result and "missing" in result[name]:
            print(f"{name}: {result[name]['missing']}")


def print_roofline(roof: dict[str, Any]) -> None:
    """Decode as a share of the bandwidth limit: a row per context, a column per engine."""
    names = list(roof["fraction"])
    print(f"decode / bandwidth limit ({roof['bandwidth_bytes_per_s'] / 1e12:.3g} TB/s)")
    print(
        f"{'context':<10}{'MB a step':>10}{'limit tok/s':>13}" + "".join(f"{n:>11}" for n in names)
    )
    for context, step in roof["step_bytes"].items():
        row = f"{context:<10}{step / 1e6:>10.1f}{roof['limit_tok_s'][context]:>13.0f}"
        for name in names:
            share = roof["fraction"][name].get(context)
            row += f"{share:>11.1%}" if share is not None else f"{'-':>11}"
        print(row)


def _row(
    label: str, key: str, result: dict[str, Any], peers: list[str], setting: dict[str, str]
) -> str:
    row = f"{label:<16}{result['ours'][key]:>9.1f}"
    for peer in peers:
        value, ratio = result[peer].get(key), result["ratios"][peer].get(key)
        row += f"{value:>11.1f}" if value is not None else f"{'-':>11}"
        row += f"{ratio:>7.2f}" if ratio is not None else f"{'-':>7}"
    return row + (f"  {setting[key]}" if key in setting else "")
