"""Decode and prefill speed at long context: ours against llama.cpp and mlx-lm.

    python -m bench decode [--peers] [--json] [--runs N] [--steps N] [--contexts C,C,...]
                           [--paste-tokens N] [--quick] [--model M] [--backend numpy|mlx]
                           [--mlx-lm-runs N] [--warmup N] [--llama-bench PATH]

For each context length C (default 128, 512, 1024, 2048, 4096, 8192) every engine starts a
fresh sequence and prefills C tokens of the same prompt (timed: prefill tok/s at C), keeps
its first C - steps positions (an exact truncation) and runs `steps` greedy decode steps
(timed: decode tok/s at context C: the steps end with C tokens in the cache, so C may be a
model's whole context length). Then the verify cost at the first context: a forward of 8
rows with logits for every row, in decode steps (what verifying 7 drafted tokens costs),
and a paste: a fresh sequence prefilled with --paste-tokens (5,000) tokens of other text,
ours in the engine's chunks, llama.cpp in its n_batch.

llama.cpp runs with flash attention off and on; each of its figures is the better of the
two (`llama_cpp_setting` says which), so a ratio is against its best setting. The JSON
records its build (system info string), thread counts, our kernels and engine settings,
and the processor. The engines take turns figure by figure (each context, then the
paste), so load on a shared machine hits the same figure of each. Figures are medians
over --runs (mlx-lm, ~20x slower here, gets --mlx-lm-runs, default 1); "spread" holds min
and max. Results go to results/decode-<timestamp>.json.
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

from bench import common, decode_args, llama_bench, roofline
from bench.busy import busy_core
from bench.decode_args import command_line
from bench.decode_report import VERIFY_ROWS, print_table, summarize
from bench.peers import make_peers
from engine.config import EngineConfig

# the options' defaults, and --quick's (a smoke run): each where the option is not given
PEERS = ("llama_cpp", "mlx_lm")
FLASH_BOTH = "off and on: each figure the better of the two (llama_cpp_setting)"


class BenchRefused(ValueError):
    """The bench cannot measure what was asked on this model (said before anything runs)."""


class OursRunner:
    """Our model's forward on one SequenceState, prefilled in the engine's chunk size."""

    name = "ours"
    setting = ""

    def __init__(self, gguf_path: Path, config: EngineConfig) -> None:
        from engine.kv_state import dtype_name
        from engine.loader import load_model
        from kernels import qmatmul

        self.lm = load_model(gguf_path, config)
        self.runner, self.ops = self.lm.runner, self.lm.ops
        self.state = self.runner.new_state()
        self.chunk = self.runner.prefill_rows
        self.context_length = self.lm.config.context_length
        self.on_gpu = self.ops.name == "mlx" and _mlx_on_gpu()
        self.settings = {
            "backend": self.ops.name,
            "runner": type(self.runner).__name__,
            "prefill_chunk": self.chunk,
            # the C kernel on packed 4/8-bit rows (kernels/qmatmul.py), else float32 BLAS
            "packed_matmul": bool(getattr(self.ops, "packed", False)),
            # how: "int8" (kernels/int8_matmul.py) or "float" (EngineConfig.cpu_matmul)
            "cpu_matmul": getattr(self.ops, "cpu_matmul", None),
            "threads": config.threads or qmatmul.default_num_threads(),
            "kv_dtype": dtype_name(self.ops.kv_dtype),  # BRANCHCHAT_KV_DTYPE
            "config": config_fields(config),
            # which path served the rows: the C step (decode, verify, prefill pieces) or not
            "cpu_step": self.runner.cpu_step is not None,
            "prefill_pieces": self.runner.prefill_chunk(self.chunk),
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

    def decode_many(self, token: int, steps: int) -> int:
        """`steps` forwards through the engine's own decode loop, greedy, no drafter: what a
        reply gets (on MLX each step is queued before the host reads its input token)."""
        from engine.decoding import DecodeRequest, decode
        from engine.draft_costs import CostModel
        from engine.sampling import SamplingSettings

        first = np.full(self.lm.config.vocab_size, -np.inf)
        first[token] = 0.0  # the loop starts from `token`, as the step loop does
        req = DecodeRequest(
            SamplingSettings(), steps + 1, frozenset(), lambda *_: None, lambda: False
        )
        out = decode(self.runner, self.state, first, req, CostModel())
        return out.token_ids[-1]

    def truncate(self, n: int) -> None:
        from engine.sequence import truncate

        truncate(self.runner, self.state, n, chunk_size=self.chunk)

    def verify(self, rows: int) -> float:
        checkpoint = self.state.checkpoint(record=True)
        t0 = time.perf_counter()
        self.runner.forward([self.state.tokens[-1]] * rows, self.state, logits="all")
        elapsed = time.perf_counter() - t0
        self.state.rollback(checkpoint)
        return elapsed


def config_fields(config: EngineConfig) -> dict[str, Any]:
    """Every EngineConfig field as a JSON value (fields added later are recorded too)."""
    from dataclasses import fields

    out: dict[str, Any] = {}
    for field in fields(config):
        value = getattr(config, field.name)
        plain = value is None or isinstance(value, bool | int | float | str)
        out[field.name] = value if plain else repr(value)
    return out


def kernel_info() -> dict[str, Any] | None:
    """kernels._qmatmul's info(): the ISA it dispatched to, its threads and pool counters
    (None where the C extension is not built)."""
    from kernels import qmatmul

    if not qmatmul.available():
        return None
    import importlib

    info: dict[str, Any] = importlib.import_module("kernels._qmatmul").info()
    return info


def measure_context(
    runner: Any, ids: list[int], context: int, steps: int, with_verify: bool
) -> dict[str, float]:
    """Prefill and decode at one context for one engine (and the verify cost, if asked)."""
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    runner.prefill(ids[:context])
    out[f"prefill_tok_s_{context}"] = context / (time.perf_counter() - t0)
    runner.truncate(context - steps)  # untimed: the decode steps end at C tokens
    token = ids[context - steps]
    step_s = _mean_step(runner, token, steps)
    out[f"decode_tok_s_{context}"] = 1.0 / step_s
    if isinstance(runner, OursRunner):  # and one forward at a time, each token read first
        runner.truncate(context - steps)
        step_s = _mean_forward(runner, token, steps)
        out[f"decode_step_tok_s_{context}"] = 1.0 / step_s
    if with_verify:
        verify_s = [runner.verify(VERIFY_ROWS) for _ in range(5)]
        if verify_s[0] is not None:
            out[f"verify_{VERIFY_ROWS}_rows_in_decode_steps"] = float(np.median(verify_s) / step_s)
    return out


def measure_paste(runner: Any, paste: list[int]) -> dict[str, float]:
    t0 = time.perf_counter()
    runner.prefill(paste)
    return {f"paste_prefill_tok_s_{len(paste)}": len(paste) / (time.perf_counter() - t0)}


def measure_all(
    runners: list[Any], ids: list[int], paste: list[int], contexts: tuple[int, ...], steps: int
) -> list[dict[str, float]]:
    """One run of every figure for every engine, interleaved figure by figure (a context,
    then the next, then the paste), so a burst of load on this shared machine hits every
    engine's same figure rather than one engine's whole run."""
    samples: list[dict[str, float]] = [{} for _ in runners]
    for runner in runners:
        runner.prefill(ids[:16])  # warm-up: first-call allocations, lazy initialisation
    for index, context in enumerate(contexts):
        for runner, sample in zip(runners, samples, strict=True):
            sample.update(measure_context(runner, ids, context, steps, with_verify=index == 0))
    if paste:
        for runner, sample in zip(runners, samples, strict=True):
            sample.update(measure_paste(runner, paste))
    return samples


def _mean_step(runner: Any, token: int, steps: int) -> float:
    if hasattr(runner, "decode_many"):  # each engine's own generation loop
        t0 = time.perf_counter()
        runner.decode_many(token, steps)
        return (time.perf_counter() - t0) / steps
    return _mean_forward(runner, token, steps)


def _mean_forward(runner: Any, token: int, steps: int) -> float:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        token = runner.decode(token)
        times.append(time.perf_counter() - t0)
    # mean over the steps, like the other contexts; the verify ratio divides by it
    return float(np.mean(times))


def check_fits(contexts: tuple[int, ...], paste_tokens: int, steps: int, limit: int) -> None:
    """Refuse, naming the figure, what the model's context or the decode window cannot hold."""
    for context in contexts:
        if context > limit:
            raise BenchRefused(
                f"context {context} is past the model's context_length {limit}: "
                f"pass --contexts with values up to {limit}"
            )
        if context <= steps:
            raise BenchRefused(
                f"context {context} must be larger than --steps {steps} "
                "(the decode steps end with the context's tokens in the cache)"
            )
    if paste_tokens > limit:
        raise BenchRefused(
            f"--paste-tokens {paste_tokens} is past the model's context_length {limit}"
        )
    if contexts[0] + VERIFY_ROWS > limit:
        raise BenchRefused(
            f"the verify of {VERIFY_ROWS} rows at context {contexts[0]} is past the model's "
            f"context_length {limit}"
        )


def run(args: argparse.Namespace, config: EngineConfig, peer_factory: Any = None) -> dict:
    """Every figure for ours and (with --peers) the peers; `peer_factory` stands in for
    make_peers (a test's fake peers)."""
    common.warn_if_busy()
    machine, versions, date = common.machine(), common.versions(), common.now_iso()
    gguf = common.model_file(args.model)
    ours = OursRunner(gguf, config)
    contexts = args.contexts
    check_fits(contexts, args.paste_tokens, args.steps, ours.context_length)
    ids = common.prompt_ids(ours.lm.tokenizer, max(contexts))
    paste = common.prompt_ids(ours.lm.tokenizer, args.paste_tokens, seed=1)
    # the most positions a figure needs: the largest context, the paste, the verify rows
    n_ctx = max(max(contexts), args.paste_tokens, contexts[0] + VERIFY_ROWS)
    runners: list[Any] = [ours]
    missing: dict[str, str] = {}
    llama_build: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory() as tmp, busy_core(args.busy):
        if args.peers:
            factory = peer_factory or _real_peers
            # with --llama-bench its binary is llama.cpp, not llama-cpp-python
            names = [n for n in PEERS if not (args.llama_bench and n == "llama_cpp")]
            peers, missing = factory(gguf, Path(tmp), n_ctx, names)
            runners += peers
            for name, why in missing.items():
                print(f"{name}: {why}", file=sys.stderr)
            builds = [r.build for r in peers if r.name == "llama_cpp"]
            if builds:
                llama_build = {**builds[0], "flash_attn": FLASH_BOTH}
        samples: dict[tuple[str, str], list[dict[str, float]]] = {
            (r.name, r.setting): [] for r in runners
        }
        warmup = args.warmup if args.warmup is not None else int(ours.on_gpu)
        for _ in range(warmup):  # a GPU's first call of each shape compiles its kernels
            measure_all(runners, ids, paste, contexts, args.steps)
            if not args.json:
                print("warm-up run: done (not counted)", file=sys.stderr)
        for run_index in range(args.runs):
            active = [r for r in runners if r.name != "mlx_lm" or run_index < args.mlx_lm_runs]
            for runner, sample in zip(
                active, measure_all(active, ids, paste, contexts, args.steps), strict=True
            ):
                samples[(runner.name, runner.setting)].append(sample)
            if not args.json:
                print(f"run {run_index + 1}/{args.runs}: done", file=sys.stderr)
    if args.llama_bench:
        by_setting, build = llama_bench.measure(
            args.llama_bench, gguf, contexts, args.steps, args.paste_tokens, args.runs
        )
        for setting, runs in by_setting.items():
            samples[("llama_cpp", setting)] = runs
        llama_build = {**build, "flash_attn": FLASH_BOTH}
    result: dict[str, Any] = {"command": command_line(args), "date": date, "busy": args.busy}
    result.update(summarize(samples, missing, gpu=ours.on_gpu))
    settings: dict[str, Any] = {
        "steps": args.steps,
        "contexts": list(contexts),
        "decode_window": "the steps end with C tokens in the cache (prefill C, keep C - steps)",
        "verify_context": contexts[0],
        "paste_tokens": args.paste_tokens,
        "ours": {**ours.settings, "kernels": kernel_info()},
    }
    if args.llama_bench:
        settings["llama_cpp"] = llama_build
    for runner in runners[1:]:
        if runner.name == "llama_cpp":
            by_setting = settings.setdefault("llama_cpp", {**(llama_build or {}), "runs": {}})
            by_setting["runs"][runner.setting] = runner.settings
        else:
            settings[runner.name] = runner.settings
    result["settings"] = settings
    bandwidth = args.bandwidth or (roofline.H200_BYTES_PER_S if ours.on_gpu else None)
    if bandwidth is not None:
        result["roofline"] = decode_roofline(gguf, ours.lm.config, result, bandwidth)
    result["machine"] = {**machine, "load_average_1m_end": round(os.getloadavg()[0], 2)}
    result["versions"] = versions
    result["model"] = {**common.model_info(gguf), "context_length": ours.context_length}
    result["runs"] = args.runs
    result["warmup_runs"] = warmup
    if any(name == "mlx_lm" for name, _ in samples):
        result["mlx_lm_runs"] = min(args.runs, args.mlx_lm_runs)
    return common.rounded(result)


def decode_roofline(gguf: Path, cfg: Any, result: dict, bandwidth: float) -> dict[str, Any]:
    """bench/roofline.py over every engine's decode figures in `result`."""
    prefix = "decode_tok_s_"
    decode = {
        name: {
            int(key[len(prefix) :]): value
            for key, value in result[name].items()
            if key.startswith(prefix)
        }
        for name in (*PEERS, "ours")
        if isinstance(result.get(name), dict) and "missing" not in result[name]
    }
    return roofline.decode_roofline(gguf, cfg, decode, bandwidth)


def _mlx_on_gpu() -> bool:
    import mlx.core as mx

    return mx.default_device() == mx.gpu


def _real_peers(
    gguf: Path, tmp: Path, n_ctx: int, names: list[str]
) -> tuple[list[Any], dict[str, str]]:
    mlx_dir = _converted(gguf, tmp) if "mlx_lm" in names else None
    return make_peers(names, gguf, mlx_dir, n_ctx, llama_flash_attn=(False, True))


def _converted(gguf: Path, directory: Path) -> Path | None:
    """mlx-lm's copy of the model; None (mlx-lm is left out, saying so) when the GGUF's
    tensor types have no MLX directory form."""
    from engine.errors import EngineError

    try:
        return common.converted_default_model(directory, gguf)
    except EngineError as exc:
        print(f"mlx_lm: cannot convert {gguf.name} ({exc})", file=sys.stderr)
        return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return decode_args.parse_args(argv, __doc__ or "")


def main(argv: list[str] | None = None, config: EngineConfig | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args, common.engine_config(config, args.backend))
    except (BenchRefused, llama_bench.LlamaBenchFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return common.report("decode", result, args.json, print_table)
