"""The decode bench with `--llama-bench PATH` as its llama.cpp peer, against a stand-in
binary that checks the arguments it is given and prints llama-bench's JSON: each figure
read under the bench's own name, the better flash-attention setting per figure, the ratios,
the build recorded, and a failing binary refused with its own words."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import decode, llama_bench
from engine.config import EngineConfig

CONTEXTS = (32, 64)
STEPS = 4
PASTE = 100

# A stand-in for llama-bench: tok/s = 1000 * (1 + flash) + n_prompt + depth + run, so every
# figure, setting and repetition is told apart; each call's argv is appended to calls.jsonl.
FAKE = """\
import json, sys
from pathlib import Path
argv = sys.argv[1:]
with open(Path(__file__).with_name("calls.jsonl"), "a") as f:
    f.write(json.dumps(argv) + "\\n")
if "--fail" in open(Path(__file__).with_name("mode")).read():
    print("main: error: failed to load model", file=sys.stderr)
    sys.exit(1)
opt = lambda name, default: argv[argv.index(name) + 1] if name in argv else default
runs = int(opt("-r", "5"))
tests = []
for flash in [int(v) for v in opt("-fa", "0").split(",")]:
    for depth in [int(v) for v in opt("-d", "0").split(",")]:
        for prompt in [int(v) for v in opt("-p", "512").split(",")]:
            ts = [1000.0 * (1 + flash) + prompt + depth + r for r in range(runs)]
            tests.append({"build_commit": "abc123", "build_number": 7, "backends": "CUDA",
                          "cpu_info": "AMD EPYC", "gpu_info": "NVIDIA H200", "n_batch": 2048,
                          "flash_attn": bool(flash), "n_prompt": prompt,
                          "n_gen": int(opt("-n", "128")), "n_depth": depth,
                          "samples_ts": ts, "avg_ts": sum(ts) / runs})
print(json.dumps(tests))
"""


@pytest.fixture
def fake_bench(tmp_path: Path) -> Path:
    script = tmp_path / "fake_llama_bench.py"
    script.write_text(FAKE)
    (tmp_path / "mode").write_text("")
    binary = tmp_path / "llama-bench"
    binary.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    binary.chmod(0o755)
    return binary


def _argv(gguf: Path, binary: Path, runs: int = 3) -> list[str]:
    return [
        "--model", str(gguf), "--runs", str(runs), "--json", "--steps", str(STEPS),
        "--contexts", ",".join(map(str, CONTEXTS)), "--paste-tokens", str(PASTE),
        "--llama-bench", str(binary),
    ]  # fmt: skip


def test_llama_bench_figures_stand_for_llama_cpp(tiny_llama_q4_gguf, fake_bench):
    gguf, _ = tiny_llama_q4_gguf
    args = decode.parse_args(_argv(gguf, fake_bench))
    result = decode.run(args, EngineConfig())
    calls = [
        json.loads(line)
        for line in (fake_bench.parent / "calls.jsonl").read_text().split("\n")
        if line
    ]
    common = ["-m", str(gguf), "-ngl", "99", "-fa", "0,1", "-r", "3"]
    assert calls == [
        [*common, "-p", "32,64,100", "-n", "0", "-o", "json"],
        [*common, "-p", "0", "-n", "4", "-d", "28,60", "-o", "json"],
    ]
    # flash on is the faster setting of the stand-in; the median of runs 0, 1 and 2 is + 1
    assert result["llama_cpp"] == {
        "prefill_tok_s_32": 2033.0,
        "prefill_tok_s_64": 2065.0,
        "paste_prefill_tok_s_100": 2101.0,
        "decode_tok_s_32": 2029.0,
        "decode_tok_s_64": 2061.0,
    }
    assert set(result["llama_cpp_setting"].values()) == {"flash_attn=on"}
    assert result["llama_cpp_by_setting"]["flash_attn=off"]["decode_tok_s_64"] == 1061.0
    for key, value in result["llama_cpp"].items():
        ratio = result["ours"][key] / value
        assert result["ratios"]["llama_cpp"][key] == pytest.approx(ratio, rel=1e-3)
    build = result["settings"]["llama_cpp"]
    assert build["gpu_info"] == "NVIDIA H200" and build["build_commit"] == "abc123"
    assert build["n_gpu_layers"] == 99
    assert result["command"].endswith(f"--llama-bench {fake_bench}")


def test_a_failing_llama_bench_is_refused_in_its_own_words(tiny_llama_q4_gguf, fake_bench, capsys):
    gguf, _ = tiny_llama_q4_gguf
    (fake_bench.parent / "mode").write_text("--fail")
    assert decode.main(_argv(gguf, fake_bench, runs=1)) == 2
    err = capsys.readouterr().err
    assert "exited 1" in err and "failed to load model" in err


def test_a_test_the_bench_did_not_ask_for_is_refused():
    entry = {"n_prompt": 16, "n_gen": 8, "n_depth": 0}
    with pytest.raises(llama_bench.LlamaBenchFailed, match="pp 16, tg 8, depth 0"):
        llama_bench.figure_name(entry, steps=32)
    with pytest.raises(llama_bench.LlamaBenchFailed, match="flash_attn=-1"):
        llama_bench.flash_setting(-1)
    assert llama_bench.flash_setting("on") == "flash_attn=on"
    assert llama_bench.flash_setting(False) == "flash_attn=off"
