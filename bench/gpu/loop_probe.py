"""Debug probe: a queued decode loop's time split (engine/decoding.py's plain run), to
tell the host's part from the device's without a profiler. Loads a GGUF as the engine
does, prefills `--context` tokens, then per mode (greedy, and sampled at the app's
0.7 / 0.95):

- `device`: `--steps` steps queued back to back, each on the last one's device token,
  none read until the end: the device's time a step where the host's launches (timed
  too) take less (the state's history takes a stand-in token: only the timing is kept);
- `loop`: the engine's decode loop over as many steps, wall time a step and, timed
  around the engine's own calls, what the host spent launching, waiting for a step, and
  drawing (`host_draw`: of it, reading the pack, deciding from it, and drawing from the
  whole row where the pack cannot tell);
- with `--lookup`, `greedy_lookup` / `sampled_lookup`: the loop with prompt lookup as its
  drafter (Auto; a fresh index each reply),
  from a made-up context of random tokens (where the periodic one of the parts above
  would give lookup a long match), beside the plain loop from that context: Auto's
  bookkeeping a step (the index's commit and proposal, timed) and what it drafted.

Prints one JSON object.     python -m bench.gpu.loop_probe --model PATH [--steps 200] [--lookup]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.gpu.host_probe import _loop
from engine import device_sampling, sampling, sampling_candidates, verify_rows
from engine.config import EngineConfig
from engine.decoding import DecodeRequest, decode
from engine.draft_costs import AcceptanceModel, CostModel
from engine.loader import load_model
from engine.runner import ahead
from engine.sampling import PositionalUniforms, SamplingSettings
from engine.sequence import prefill
from engine.suffix_drafter import SuffixDrafter

MODES = {
    "greedy": SamplingSettings(temperature=0.0, seed=0),
    "sampled": SamplingSettings(temperature=0.7, top_p=0.95, seed=0),
}


def _device(
    runner: Any, state: Any, token: int, steps: int, s: SamplingSettings
) -> tuple[float, float]:
    """(seconds a step with `steps` queued on one another and read once at the end, the
    host's seconds a step in launching them: the first is the device's time where it is
    the larger)."""
    uniforms = PositionalUniforms(s.seed)

    def draw() -> Any:
        return None if s.is_greedy else device_sampling.draw(s, uniforms.uniform(state.offset + 1))

    step = runner.launch([token], state, draw())
    step.end(token)
    step.read()
    launching = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        t1 = time.perf_counter()
        step = runner.launch(step.top, state, draw())
        launching += time.perf_counter() - t1
        step.end(0)  # the history's stand-in: the rows are the device tokens'
    step.read()
    return (time.perf_counter() - t0) / steps, launching / steps


def _timed(owner: Any, name: str, into: dict[str, float]) -> Callable[[], None]:
    """Wraps owner.name to add its seconds into into[name]; returns the undo, which leaves
    owner as it was (an instance's method wrapped is its class's again)."""
    original = getattr(owner, name)
    own = name in vars(owner)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into[name] += time.perf_counter() - t0

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original) if own else delattr(owner, name)


def probe(path: str, context: int, steps: int, lookup: bool = False) -> dict[str, Any]:
    lm = load_model(path, EngineConfig.from_environment())
    out: dict[str, Any] = {"model": path, "context": context, "steps": steps}
    for mode, s in MODES.items():
        out[mode] = _split(lm, context, steps, s)
        if lookup:
            out[f"{mode}_lookup"] = _lookup_split(lm, context, steps, s)
    out["path"] = lm.runner.last_path
    return out


def _lookup_split(lm: Any, context: int, steps: int, s: SamplingSettings) -> dict[str, Any]:
    """The decode loop from a context of random tokens, plain and with lookup (µs a token),
    each after an untimed reply of 10 tokens; each reply with an index of its own (one
    that held the untimed reply would draft it again)."""
    tokens = [int(t) for t in np.random.default_rng(0).integers(100, lm.config.vocab_size, context)]
    out: dict[str, Any] = {}
    for name, with_lookup in (("plain", False), ("lookup", True)):
        spent: dict[str, float] = defaultdict(float)
        undo = [_timed(SuffixDrafter, "commit", spent), _timed(SuffixDrafter, "propose", spent)]
        try:
            for n in (10, steps):
                spent.clear()
                drafter = SuffixDrafter() if with_lookup else None
                state = lm.runner.new_state()
                last = np.asarray(lm.ops.to_numpy(prefill(lm.runner, state, tokens)))[-1]
                req = DecodeRequest(
                    s, n, frozenset(), lambda *_: None, lambda: False, drafter, AcceptanceModel()
                )
                t0 = time.perf_counter()
                result = decode(lm.runner, state, np.asarray(last, np.float64), req, CostModel())
                wall = time.perf_counter() - t0
        finally:
            for u in undo:
                u()
        produced = len(result.token_ids)
        out[name] = {
            "loop_us": round(wall / produced * 1e6, 1),
            "drafted": result.drafted,
            "verifies": result.verifies,
            **{f"{k}_us": round(v / produced * 1e6, 2) for k, v in sorted(spent.items())},
        }
    return out


def _split(lm: Any, context: int, steps: int, s: SamplingSettings) -> dict[str, float]:
    """One mode's figures (the module docstring's), on a fresh state each part."""
    runner, vocab = lm.runner, lm.config.vocab_size
    state = runner.new_state()
    logits = prefill(runner, state, [3 + (7 * i) % 90 for i in range(context)])
    token = int(np.argmax(lm.ops.to_numpy(logits)[-1]))
    _loop(runner, state, vocab, token, 10, s)  # compiled, untimed
    device_s, launch_s = _device(runner, state, token, steps, s)
    state = runner.new_state()
    prefill(runner, state, [3 + (7 * i) % 90 for i in range(context)])
    spent: dict[str, float] = defaultdict(float)
    undo = [
        _timed(runner, "launch", spent),
        _timed(ahead.Launch, "read", spent),
        _timed(verify_rows, "host_draw", spent),
        _timed(ahead.Launch, "read_pack", spent),
        _timed(sampling_candidates, "decide", spent),
        _timed(sampling, "sample", spent),
    ]
    try:
        t0 = time.perf_counter()
        _loop(runner, state, vocab, token, steps, s)
        wall = time.perf_counter() - t0
    finally:
        for u in undo:
            u()
    return {
        "device_us": round(device_s * 1e6, 1),
        "device_launch_us": round(launch_s * 1e6, 1),
        "loop_us": round(wall / steps * 1e6, 1),
        **{f"{k}_us": round(v / steps * 1e6, 1) for k, v in sorted(spent.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a .gguf file")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lookup", action="store_true", help="and the loop with prompt lookup")
    args = ap.parse_args()
    print(json.dumps(probe(args.model, args.context, args.steps, args.lookup), indent=1))


if __name__ == "__main__":
    main()
