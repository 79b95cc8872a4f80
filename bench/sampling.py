"""`python -m bench sampling`: what the host's draw of a sampled token costs.

Every sampled token is drawn on the host in float64 from the row's logits
(engine/sampling.py), also where a GPU step was queued on the device's own draw. So the
draw is part of each step's host work, which a queued step must hide behind the kernel.
Timed on rows of a real reply: the default model answers a question in sampled decoding
(the rows as the engine reads them), and each row is drawn `--runs` times with the
engine's `sample`, and beside it with the plain form (a sort of the whole vocabulary for
top-p, the inverse CDF over the whole row). Both must give the same token on every row.
For a nucleus draw, also the host's draw from the device's pack of the likeliest tokens
(engine/sampling_candidates.py), which must give `sample`'s token wherever it decides.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench import common
from engine import sampling_candidates
from engine.config import EngineConfig
from engine.loader import load_model
from engine.sampling import PositionalUniforms, SamplingSettings, penalize, sample
from engine.sequence import prefill

SETTINGS = {
    "t0.7-top_p0.95": SamplingSettings(temperature=0.7, top_p=0.95, seed=0),
    "t1.0-top_p0.9-top_k40-min_p0.05": SamplingSettings(
        temperature=1.0, top_p=0.9, top_k=40, min_p=0.05, seed=0
    ),
    "t1.0": SamplingSettings(temperature=1.0, seed=0),
}
QUESTION = "Explain how photosynthesis works, step by step."


def plain_sample(
    logits: np.ndarray, history: Sequence[int], s: SamplingSettings, u: PositionalUniforms
) -> int:
    """The draw as written out whole: every weight, a full sort for top-p, the CDF of the
    whole row."""
    x = penalize(np.asarray(logits, dtype=np.float64), history, s) / s.temperature
    p = np.exp(x - x.max())
    if s.top_k and s.top_k < p.size:
        p[p < np.sort(p)[-s.top_k]] = 0.0
    if s.min_p > 0:
        p[p < s.min_p * p.max()] = 0.0
    if s.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cut = int(np.searchsorted(np.cumsum(p[order]) / p.sum(), s.top_p)) + 1
        kept = np.zeros_like(p)
        kept[order[:cut]] = p[order[:cut]]
        p = kept
    cdf = np.cumsum(p)
    return int(np.searchsorted(cdf, u.uniform(len(history)) * cdf[-1], side="right"))


def reply_rows(path: Any, config: EngineConfig, steps: int) -> tuple[list[np.ndarray], list[int]]:
    """The logits rows of a sampled reply to QUESTION (of a model without a chat template,
    a continuation of it), and the tokens: each row's history is a prefix of them."""
    from bench.edit import render_ids

    lm = load_model(path, config)
    if lm.tokenizer.chat_template is not None:
        ids = render_ids(lm.tokenizer, [("user", QUESTION)])
    else:
        ids = lm.tokenizer.encode(QUESTION, add_special=lm.tokenizer.add_bos)
    state = lm.runner.new_state()
    row = np.asarray(lm.ops.to_numpy(prefill(lm.runner, state, ids)), np.float32)[-1]
    s, u = SETTINGS["t0.7-top_p0.95"], PositionalUniforms(0)
    rows = []
    for _ in range(steps):
        rows.append(row)
        token = sample(row, state.tokens, s, u)
        row = np.asarray(lm.ops.to_numpy(lm.runner.forward([token], state)), np.float32)[-1]
    return rows, list(state.tokens)


def time_draws(rows: list[np.ndarray], tokens: list[int], runs: int) -> dict[str, Any]:
    """Per setting: ms a draw, ours and the plain form's (the faster of `runs` passes),
    and whether the two drew the same token from every row."""
    start = len(tokens) - len(rows) + 1  # row i follows tokens[: start + i]
    drawn = [(row, tokens[: start + i]) for i, row in enumerate(rows)]
    out: dict[str, Any] = {}
    for name, s in SETTINGS.items():
        u = PositionalUniforms(s.seed)
        same = all(sample(r, h, s, u) == plain_sample(r, h, s, u) for r, h in drawn)
        ours, plain = [], []
        for _ in range(runs):
            for draw, times in ((sample, ours), (plain_sample, plain)):
                times.append(
                    common.timed(lambda d=draw, s=s, u=u: [d(r, h, s, u) for r, h in drawn])
                )
        ours_ms, plain_ms = (min(t) / len(rows) * 1e3 for t in (ours, plain))
        out[name] = {
            "ms_a_draw": ours_ms,
            "plain_ms_a_draw": plain_ms,
            "speedup": plain_ms / ours_ms,
            "same_tokens": same,
        } | (time_packed(drawn, s, runs) if sampling_candidates.can_decide(s) else {})
    return out


def time_packed(drawn: list[tuple[np.ndarray, list[int]]], s: Any, runs: int) -> dict[str, Any]:
    """The host's draw from the device's pack of each row (engine/sampling_candidates.py;
    the pack made beforehand, as the device makes it with the step): ms a draw, how many
    rows it decided, and whether each decided token is `sample`'s."""
    import mlx.core as mx

    from engine.device_sampling import pack

    u = PositionalUniforms(s.seed)
    packs = [(np.asarray(pack(mx.array(r), s.temperature)), u.uniform(len(h))) for r, h in drawn]
    tokens = [sampling_candidates.decide(p, s, at) for p, at in packs]
    times = [
        common.timed(lambda: [sampling_candidates.decide(p, s, at) for p, at in packs])
        for _ in range(runs)
    ]
    return {
        "pack_ms_a_draw": min(times) / len(packs) * 1e3,
        "pack_decided": sum(t is not None for t in tokens),
        "pack_same_tokens": all(
            t is None or t == sample(r, h, s, u) for t, (r, h) in zip(tokens, drawn, strict=True)
        ),
    }


def main(argv: list[str], config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench sampling", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--model", default=None, help="a GGUF file (default: the default model)")
    parser.add_argument("--rows", type=int, default=64, help="rows of the reply drawn from")
    parser.add_argument("--runs", type=int, default=5, help="timed passes over the rows")
    parser.add_argument("--backend", choices=("numpy", "mlx"), default=None)
    args = parser.parse_args(argv)
    config = common.engine_config(config, args.backend)
    path = common.model_file(args.model)
    rows, tokens = reply_rows(path, config, args.rows)
    result: dict[str, Any] = {
        "command": "python -m bench sampling " + " ".join(argv),
        "rows": len(rows),
        "vocab": int(rows[0].size),
        "settings": {name: repr(s) for name, s in SETTINGS.items()},
        "draws": time_draws(rows, tokens, args.runs),
    }
    if not args.json:
        for name, d in result["draws"].items():
            print(
                f"{name:34} {d['ms_a_draw']:.3f} ms a draw, the plain form "
                f"{d['plain_ms_a_draw']:.3f} ({d['speedup']:.2f}x), same tokens: {d['same_tokens']}"
            )
            if "pack_ms_a_draw" in d:
                print(
                    f"{'':34} from the pack {d['pack_ms_a_draw']:.3f} ms, decided "
                    f"{d['pack_decided']} of {result['rows']}, same: {d['pack_same_tokens']}"
                )
    result.update(
        model=common.model_info(path), machine=common.machine(), versions=common.versions()
    )
    return common.report("sampling", common.rounded(result), args.json)
