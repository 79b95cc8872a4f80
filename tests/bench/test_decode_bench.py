"""The decode bench's loop and JSON on a tiny model: every figure per context, llama.cpp's
best setting per figure, ratios, the refusal of a context past the model's, and the exact
truncation each runner's decode window depends on. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import decode
from bench.decode_report import best_of, summarize
from engine.config import EngineConfig

CONTEXTS = (32, 64)
STEPS = 4
PASTE = 100


class FakeLlamaCpp:
    """Stands in for llama.cpp under one flash-attention setting: our own forward on the
    same model, under llama.cpp's name, with no verify (as the real runner)."""

    name = "llama_cpp"

    def __init__(self, gguf: Path, setting: str) -> None:
        self.inner = decode.OursRunner(gguf, EngineConfig())
        self.setting = setting
        self.settings = {"flash_attn": setting.endswith("on")}
        self.build = {"system_info": "CPU : AVX512 = 1 |", "features": ["AVX512"]}

    def prefill(self, ids: list[int]) -> int:
        return self.inner.prefill(ids)

    def decode(self, token: int) -> int:
        return self.inner.decode(token)

    def truncate(self, n: int) -> None:
        self.inner.truncate(n)

    def verify(self, rows: int) -> None:
        return None


def _args(gguf: Path, **overrides: Any) -> list[str]:
    options = {"contexts": ",".join(map(str, CONTEXTS)), "steps": STEPS, "paste-tokens": PASTE}
    options.update(overrides)
    argv = ["--model", str(gguf), "--runs", "1", "--json"]
    for key, value in options.items():
        argv += [f"--{key}", str(value)]
    return argv


def test_best_of_takes_the_faster_setting_and_the_cheaper_verify():
    best, chosen = best_of(
        {
            "flash_attn=off": {"decode_tok_s_128": 90.0, "verify_8_rows_in_decode_steps": 2.5},
            "flash_attn=on": {"decode_tok_s_128": 95.0, "verify_8_rows_in_decode_steps": 3.0},
        }
    )
    assert best == {"decode_tok_s_128": 95.0, "verify_8_rows_in_decode_steps": 2.5}
    assert chosen == {
        "decode_tok_s_128": "flash_attn=on",
        "verify_8_rows_in_decode_steps": "flash_attn=off",
    }


def test_summarize_divides_ours_by_the_peers_best_and_checks_the_targets():
    samples = {
        ("ours", ""): [{"decode_tok_s_128": 120.0, "prefill_tok_s_512": 600.0}],
        ("llama_cpp", "flash_attn=off"): [{"decode_tok_s_128": 80.0, "prefill_tok_s_512": 500}],
        ("llama_cpp", "flash_attn=on"): [{"decode_tok_s_128": 100.0, "prefill_tok_s_512": 300}],
    }
    result = summarize(samples, {"mlx_lm": "not installed"})
    assert result["llama_cpp"] == {"decode_tok_s_128": 100.0, "prefill_tok_s_512": 500.0}
    assert result["llama_cpp_setting"] == {
        "decode_tok_s_128": "flash_attn=on",
        "prefill_tok_s_512": "flash_attn=off",
    }
    assert result["ratios"] == {"llama_cpp": {"decode_tok_s_128": 1.2, "prefill_tok_s_512": 1.2}}
    assert result["targets"]["decode_tok_s_128_vs_llama_cpp"]["met"] is True
    assert result["targets"]["prefill_tok_s_512_vs_llama_cpp"]["met"] is False
    assert result["mlx_lm"] == {"missing": "not installed"}
    assert set(result["spread"]) == {
        "ours",
        "llama_cpp[flash_attn=off]",
        "llama_cpp[flash_attn=on]",
    }


def test_on_a_gpu_the_targets_are_issue_15s_against_both_peers():
    samples = {
        ("ours", ""): [{"decode_tok_s_2048": 900.0, "prefill_tok_s_1024": 18000.0}],
        ("llama_cpp", "flash_attn=on"): [{"decode_tok_s_2048": 850.0, "prefill_tok_s_1024": 57000}],
        ("mlx_lm", ""): [{"decode_tok_s_2048": 500.0, "prefill_tok_s_1024": 10000.0}],
    }
    result = summarize(samples, {}, gpu=True)
    assert result["targets_issue"] == 15
    got = {k: (v["at_least"], v["met"]) for k, v in result["targets"].items()}
    assert got == {
        "decode_tok_s_2048_vs_llama_cpp": (1.0, True),
        "decode_tok_s_2048_vs_mlx_lm": (2.0, False),  # 1.8x
        "prefill_tok_s_1024_vs_llama_cpp": (1.0, False),
        "prefill_tok_s_1024_vs_mlx_lm": (1.5, True),
    }
    # the CPU's targets (issue 21) have no 1024 prefill and no mlx-lm bound
    assert set(summarize(samples, {})["targets"]) == {"decode_tok_s_2048_vs_llama_cpp"}


def test_run_with_fake_peers_writes_every_figure_and_its_ratio(tiny_llama_q4_gguf, capsys):
    gguf, _ = tiny_llama_q4_gguf

    def peers(
        model: Path, _tmp: Path, n_ctx: int, names: list[str]
    ) -> tuple[list[Any], dict[str, str]]:
        assert n_ctx == PASTE  # the paste is the longest sequence asked for
        assert names == ["llama_cpp", "mlx_lm"]
        fakes = [FakeLlamaCpp(model, f"flash_attn={s}") for s in ("off", "on")]
        return fakes, {"mlx_lm": "left out by the test"}

    args = decode.parse_args([*_args(gguf), "--peers"])
    result = decode.run(args, EngineConfig(), peer_factory=peers)
    figures = {f"{kind}_tok_s_{c}" for kind in ("prefill", "decode") for c in CONTEXTS}
    figures.add(f"paste_prefill_tok_s_{PASTE}")
    # ours also decodes one forward at a time, each token read before the next step
    steps = {f"decode_step_tok_s_{c}" for c in CONTEXTS}
    assert set(result["ours"]) == figures | steps | {"verify_8_rows_in_decode_steps"}
    assert set(result["llama_cpp"]) == figures
    assert set(result["llama_cpp_setting"]) == figures
    for key in figures:
        by_setting = result["llama_cpp_by_setting"]
        fastest = max(by_setting, key=lambda s: by_setting[s][key])
        assert result["llama_cpp"][key] == by_setting[fastest][key]
        assert result["llama_cpp_setting"][key] == fastest
        ratio = result["ours"][key] / result["llama_cpp"][key]
        assert result["ratios"]["llama_cpp"][key] == pytest.approx(ratio, rel=1e-3)
    settings = result["settings"]
    assert settings["contexts"] == list(CONTEXTS) and settings["paste_tokens"] == PASTE
    assert settings["llama_cpp"]["system_info"] == "CPU : AVX512 = 1 |"
    assert set(settings["llama_cpp"]["runs"]) == {"flash_attn=off", "flash_attn=on"}
    assert "threads" in settings["ours"]["config"]  # every EngineConfig field is recorded
    assert settings["ours"]["kernels"] is None or "isa" in settings["ours"]["kernels"]
    assert {"cpu", "cores", "load_average_1m", "load_average_1m_end"} <= set(result["machine"])
    assert result["model"]["context_length"] == 512
    assert result["mlx_lm"] == {"missing": "left out by the test"}
    json.dumps(result)  # the report writes it as it is


def test_warmup_runs_every_figure_first_and_counts_none_of_it(tiny_llama_q4_gguf):
    gguf, _ = tiny_llama_q4_gguf
    prefills: list[int] = []

    def peers(model: Path, _tmp: Path, n_ctx: int, names: list[str]) -> Any:
        fake = FakeLlamaCpp(model, "flash_attn=on")
        inner_prefill = fake.prefill
        fake.prefill = lambda ids: prefills.append(len(ids)) or inner_prefill(ids)  # type: ignore[method-assign]
        return [fake], {}

    for warmup, expected in ((0, 1), (2, 3)):
        prefills.clear()
        args = decode.parse_args([*_args(gguf), "--peers", "--warmup", str(warmup)])
        result = decode.run(args, EngineConfig(), peer_factory=peers)
        # each run: a 16-token warm-up prefill, then each context's and the paste's
        assert prefills == [16, *CONTEXTS, PASTE] * expected
        assert result["warmup_runs"] == warmup and result["runs"] == 1
        assert result["command"].endswith(f"--warmup {warmup}")
    # on a CPU no warm-up unless asked (the numpy backend named: a GPU machine's default is
    # MLX on its GPU, which warms up once)
    cpu = EngineConfig(backend="numpy")
    assert decode.run(decode.parse_args(_args(gguf)), cpu)["warmup_runs"] == 0


def test_a_context_past_the_models_is_refused_before_anything_runs(
    tiny_llama_q4_gguf, tmp_path, monkeypatch, capsys
):
    gguf, _ = tiny_llama_q4_gguf
    monkeypatch.chdir(tmp_path)
    assert decode.main(_args(gguf, contexts="64,1024")) == 2
    assert "context 1024 is past the model's context_length 512" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()
    assert decode.main(_args(gguf, contexts="4,64")) == 2  # no room for 4 decode steps
    assert "context 4 must be larger than --steps 4" in capsys.readouterr().err


def test_parse_args_defaults_quick_and_contexts():
    args = decode.parse_args([])
    assert args.contexts == (128, 512, 1024, 2048, 4096, 8192) and args.paste_tokens == 5000
    assert (args.runs, args.steps) == (3, 32)
    quick = decode.parse_args(["--quick"])
    assert (quick.contexts, quick.runs, quick.steps, quick.paste_tokens) == ((128, 512), 1, 8, 512)
    assert decode.parse_args(["--quick", "--runs", "2"]).runs == 2  # a given option stays
    assert decode.parse_args(["--contexts", "2048,128,2048"]).contexts == (128, 2048)
    with pytest.raises(SystemExit):
        decode.parse_args(["--contexts", "128,big"])


def _last_logits(runner: Any, token: int) -> np.ndarray:
    if isinstance(runner, decode.OursRunner):
        return np.array(runner.runner.forward([token], runner.state), dtype=np.float32)[-1]
    runner.llm.eval([token])
    row = runner.llm._ctx.get_logits_ith(-1)
    return np.ctypeslib.as_array(row, shape=(runner.llm.n_vocab(),)).copy()


def _runner(kind: str, gguf: Path) -> Any:
    if kind == "ours":
        return decode.OursRunner(gguf, EngineConfig())
    if kind == "ours_mlx_bfloat16":  # the GPU's dtype, on whatever MLX device there is
        return decode.OursRunner(gguf, EngineConfig(backend="mlx", dtype="bfloat16"))
    pytest.importorskip("llama_cpp")
    from bench.peers import LlamaCppRunner

    return LlamaCppRunner(gguf, n_ctx=128)


@pytest.mark.parametrize("kind", ["ours", "ours_mlx_bfloat16", "llama_cpp"])
def test_truncate_leaves_what_a_fresh_prefill_does(kind, tiny_llama_q4_gguf):
    """The decode window starts from a truncated prefill: the step after it must give the
    logits a fresh prefill of the kept tokens gives, bit for bit in float32 on a CPU. In
    bfloat16 a product's rounding may depend on how many rows it has (a GPU's matmul tiles
    48 rows unlike 30), so there the two agree within the dtype's rounding, a bound that
    a state kept one row too long still breaks."""
    from bench import common

    gguf, _ = tiny_llama_q4_gguf
    runner = _runner(kind, gguf)
    tokenizer = decode.OursRunner(gguf, EngineConfig()).lm.tokenizer
    ids = common.prompt_ids(tokenizer, 48)
    runner.prefill(ids[:30])
    fresh = _last_logits(runner, ids[30])
    runner.prefill(ids[:48])
    runner.truncate(30)
    got = _last_logits(runner, ids[30])
    ops = getattr(runner, "ops", None)
    if ops is None or ops.name == "numpy" or (kind == "ours" and not runner.on_gpu):
        np.testing.assert_array_equal(got, fresh)
        return
    bound = 0.02 * float(np.linalg.norm(fresh))  # bfloat16 keeps 8 bits: ~0.4% a rounding
    assert float(np.linalg.norm(got - fresh)) <= bound
    runner.prefill(ids[:48])
    runner.truncate(31)  # one row too many kept
    assert float(np.linalg.norm(_last_logits(runner, ids[30]) - fresh)) > bound


class RecordingRunner:
    """Records each prefill's length: the order the engines were measured in."""

    def __init__(self, name: str, log: list[tuple[str, int]]) -> None:
        self.name, self.log = name, log

    def prefill(self, ids: list[int]) -> int:
        self.log.append((self.name, len(ids)))
        return 0

    def decode(self, token: int) -> int:
        return token

    def truncate(self, n: int) -> None:
        pass

    def verify(self, rows: int) -> None:
        return None


def test_engines_take_turns_figure_by_figure():
    log: list[tuple[str, int]] = []
    runners = [RecordingRunner("a", log), RecordingRunner("b", log)]
    samples = decode.measure_all(runners, list(range(64)), list(range(50)), (32, 64), STEPS)
    assert log == [
        ("a", 16), ("b", 16), ("a", 32), ("b", 32), ("a", 64), ("b", 64), ("a", 50), ("b", 50)
    ]  # fmt: skip
    assert set(samples[0]) == {
        "prefill_tok_s_32", "decode_tok_s_32", "prefill_tok_s_64", "decode_tok_s_64",
        "paste_prefill_tok_s_50",
    }  # fmt: skip


@pytest.mark.parametrize("backend", ["numpy", "mlx"])
def test_ours_decodes_through_the_engines_loop_as_the_step_loop_does(tiny_llama_q4_gguf, backend):
    """`decode_many` (the engine's decode loop; on MLX its steps queued ahead) ends where
    one forward a step ends: the same last token, the same state."""
    gguf, _ = tiny_llama_q4_gguf
    ours = decode.OursRunner(gguf, EngineConfig(backend=backend))
    ids = list(range(3, 40))
    first = ours.prefill(ids)
    token = first
    for _ in range(9):
        token = ours.decode(token)
    stepped = list(ours.state.tokens)
    ours.truncate(len(ids))
    assert ours.decode_many(first, 9) == token
    assert ours.state.tokens == stepped


def test_busy_burns_a_share_of_a_core_while_the_bench_runs(tiny_llama_q4_gguf, monkeypatch):
    """--busy F: a burner process runs through every figure and is gone after it; the
    JSON and the reproducing command carry F; a share outside 0..1 is refused."""
    import os
    import time

    from bench.busy import busy_core

    with busy_core(0.5) as proc:
        assert proc is not None and proc.poll() is None
        start = time.monotonic()
        ticks = 0
        while ticks == 0 and time.monotonic() - start < 10:  # its CPU time moves
            time.sleep(0.1)
            stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks = int(stat[11]) + int(stat[12])  # utime, stime
        assert ticks > 0
    assert proc.poll() is not None
    seen = []
    real = decode.measure_all

    def measured(*a: Any) -> Any:
        seen.append(any(p.startswith("import time") for p in _children_cmdlines(os.getpid())))
        return real(*a)

    monkeypatch.setattr(decode, "measure_all", measured)
    gguf, _ = tiny_llama_q4_gguf
    args = decode.parse_args([*_args(gguf), "--busy", "0.5"])
    result = decode.run(args, EngineConfig())
    assert seen and all(seen) and not any(_children_cmdlines(os.getpid()))
    assert result["busy"] == 0.5 and result["command"].endswith("--busy 0.5")
    for bad in ("1.5", "-0.1", "most"):
        with pytest.raises(SystemExit):
            decode.parse_args(["--busy", bad])


def _children_cmdlines(pid: int) -> list[str]:
    """The `-c` code of each live child process of `pid` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == pid and stat[0] != "Z" and len(cmdline) > 2 and cmdline[1] == b"-c":
            out.append(cmdline[2].decode().strip())
    return out
