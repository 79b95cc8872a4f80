"""llama.cpp's own `llama-bench` as the decode bench's llama.cpp peer (`--llama-bench PATH`),
for a build llama-cpp-python does not give: its CUDA build on a GPU machine
(tools/gpu/llama_cuda.sh builds it from the llama.cpp that llama-cpp-python's sdist vendors).

It measures the decode bench's figures under the same names, flash attention off and on:
`prefill_tok_s_C` is a prompt of C tokens on an empty cache (`-p C -n 0`), the paste one of
--paste-tokens; `decode_tok_s_C` is `steps` generated tokens that end with C in the cache
(`-p 0 -n steps -d C - steps`), as ours. Every layer on the GPU (`-ngl 99`), llama-bench's
default batch sizes; each run is one of its repetitions (`-r runs`, after its warm-up). It
runs after the other engines, not interleaved with them: a binary times its own loop.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

SETTINGS = {0: "flash_attn=off", 1: "flash_attn=on"}
BUILD_FIELDS = ("build_commit", "build_number", "backends", "cpu_info", "gpu_info", "n_batch")


class LlamaBenchFailed(RuntimeError):
    """llama-bench exited with an error or printed what this module cannot read."""


def flash_setting(value: Any) -> str:
    """llama-bench's flash_attn field (a bool in older builds, an int or a name in newer)."""
    named = {"on": 1, "enabled": 1, "true": 1, "off": 0, "disabled": 0, "false": 0}
    flag = named.get(value.lower()) if isinstance(value, str) else int(value)
    if flag not in SETTINGS:
        raise LlamaBenchFailed(f"llama-bench reported flash_attn={value!r}, neither off nor on")
    return SETTINGS[flag]


def run_json(binary: Path, args: list[str]) -> list[dict[str, Any]]:
    command = [str(binary), *args, "-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise LlamaBenchFailed(f"{' '.join(command)} exited {done.returncode}: {' | '.join(tail)}")
    try:
        entries = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise LlamaBenchFailed(f"llama-bench printed no JSON list ({exc})") from None
    if not isinstance(entries, list) or not entries:
        raise LlamaBenchFailed("llama-bench printed no test")
    return entries


def figure_name(entry: dict[str, Any], steps: int) -> str:
    prompt, gen, depth = (int(entry[k]) for k in ("n_prompt", "n_gen", "n_depth"))
    if gen == 0 and depth == 0:
        return f"prefill_tok_s_{prompt}"
    if prompt == 0 and gen == steps:
        return f"decode_tok_s_{depth + steps}"
    raise LlamaBenchFailed(f"unexpected llama-bench test: pp {prompt}, tg {gen}, depth {depth}")


def measure(
    binary: Path,
    gguf: Path,
    contexts: tuple[int, ...],
    steps: int,
    paste_tokens: int,
    runs: int,
) -> tuple[dict[str, list[dict[str, float]]], dict[str, Any]]:
    """Samples per setting ({"flash_attn=off": [run 1's figures, ...], ...}) and the
    build (llama-bench's own fields). The paste's figure is `paste_prefill_tok_s_N`."""
    common = ["-m", str(gguf), "-ngl", "99", "-fa", "0,1", "-r", str(runs)]
    prompts = sorted({*contexts, *([paste_tokens] if paste_tokens else [])})
    entries = run_json(binary, [*common, "-p", ",".join(map(str, prompts)), "-n", "0"])
    depths = ",".join(str(c - steps) for c in contexts)
    entries += run_json(binary, [*common, "-p", "0", "-n", str(steps), "-d", depths])
    samples: dict[str, list[dict[str, float]]] = {
        s: [{} for _ in range(runs)] for s in SETTINGS.values()
    }
    paste = f"prefill_tok_s_{paste_tokens}"
    for entry in entries:
        name = figure_name(entry, steps)
        # the paste's prompt is a prefill figure too where it is also one of the contexts
        names = [n for n in (name,) if n != paste or paste_tokens in contexts]
        names += [f"paste_{paste}"] if paste_tokens and name == paste else []
        values = [float(v) for v in entry["samples_ts"]]
        if len(values) != runs:
            raise LlamaBenchFailed(f"{name}: {len(values)} samples for -r {runs}")
        for sample, value in zip(samples[flash_setting(entry["flash_attn"])], values, strict=True):
            sample.update(dict.fromkeys(names, value))
    build = {k: entries[0][k] for k in BUILD_FIELDS if k in entries[0]}
    build["binary"] = str(binary)
    build["n_gpu_layers"] = 99
    return samples, build
