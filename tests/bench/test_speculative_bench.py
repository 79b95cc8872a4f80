"""The speculative bench's loop and JSON on the default model: greedy runs check every
mode's tokens against plain decoding's; sampled runs (the app's default settings) record
their settings and leave identity out, since a sampled verify keeps the distribution,
not each draw. No timing is asserted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import block_pass_time, speculative
from bench.speculative import Sample, summarize
from engine.default_model import is_default_model_present
from engine.sampling import SamplingSettings


def sample(ids: tuple[tuple[int, ...], ...], tok_s: float = 100.0) -> Sample:
    tokens = sum(len(t) for t in ids)
    return Sample(tokens, tokens / tok_s, ids, drafted=4, accepted=3, verifies=2)


def test_identity_is_judged_for_greedy_runs_only() -> None:
    same = {"plain": [sample(((1, 2, 3),))], "auto": [sample(((1, 2, 3),), 200.0)]}
    other = {"plain": [sample(((1, 2, 3),))], "auto": [sample(((1, 2, 4),), 200.0)]}
    assert summarize(same)["identical"] is True
    assert summarize(other)["identical"] is False
    assert summarize(other, greedy=False)["identical"] is None
    auto = summarize(same)["auto"]
    assert auto["speedup"] == pytest.approx(2.0) and auto["acceptance"] == 0.75
    assert auto["acceptance_length"] == 2.5  # (3 accepted + 2 of the target's own) / 2


@pytest.mark.real_model
@pytest.mark.skipif(not is_default_model_present(), reason="the default model is not fetched")
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_run_writes_its_settings_and_figures(
    temperature: float, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--runs", "1", "--max-tokens", "8", "--modes", "plain,lookup"]
    argv += ["--workloads", "chat", "--json", "--temperature", str(temperature), "--top-p", "0.95"]
    assert speculative.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    chat = result["workloads"]["chat"]
    assert result["settings"]["sampling"]["temperature"] == temperature
    assert chat["tokens"] == 8 and chat["lookup"]["tok_s"]["median"] > 0
    assert chat["identical"] is (True if temperature == 0 else None)
    assert ("--temperature 0.7" in result["command"]) == (temperature > 0)


@pytest.mark.real_model
@pytest.mark.skipif(not is_default_model_present(), reason="the default model is not fetched")
def test_the_pass_timing_leaves_the_drafter_empty_and_drafting_as_before() -> None:
    from engine.config import EngineConfig
    from engine.default_model import default_model_path
    from engine.loader import load_model
    from engine.session import Session

    session = Session(load_model(default_model_path(), EngineConfig()), config=EngineConfig())
    drafter = session.block_drafter
    assert drafter is not None
    context = list(range(100, 140))
    rows = np.random.default_rng(1).standard_normal((40, 576)).astype(np.float32)
    drafter.begin(context)
    drafter.observe_hidden(rows, 0)
    before = drafter.propose(7, 4).tokens
    timed = block_pass_time.time_block_pass(drafter, ks=(1, 4, 99), context=50, repeats=2)
    assert list(timed) == ["1", "4"] and all(ms > 0 for ms in timed.values())
    assert drafter.cursor == 0 and drafter.tokens == []
    drafter.begin(context)
    drafter.observe_hidden(rows, 0)
    assert drafter.propose(7, 4).tokens == before
    # the engine's pass is one call (C on NumPy, traced on an MLX GPU): the op-by-op pass
    # is timed beside it
    one_call = drafter.cpu_pass if session.loaded.ops.name == "numpy" else drafter.compiled
    assert one_call is not None
    both = block_pass_time.pass_times(drafter, SamplingSettings())
    assert set(both) == {"block_pass_ms", "block_pass_ms_op_by_op"}
    assert (
        list(both["block_pass_ms"]) == list(both["block_pass_ms_op_by_op"]) == ["1", "4", "8", "15"]
    )
    # sampled: the coupled draws over the draft vocabulary beside full-row draws
    sampled = block_pass_time.pass_times(drafter, SamplingSettings(temperature=0.7, top_p=0.95))
    assert set(sampled) == {"block_pass_ms", "block_pass_ms_full_row_draws"}
    assert drafter.cursor == 0 and drafter._sample is None  # left reset and uncoupled


@pytest.mark.real_model
@pytest.mark.skipif(not is_default_model_present(), reason="the default model is not fetched")
def test_a_draft_model_drafts_in_its_mode_and_joins_auto(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The default model as its own draft model: as large as the target, so the cost model
    never tries it (engine/draft_costs.py: its prior cost is a whole step a token), and
    the output is plain decoding's in every mode."""
    from engine.default_model import default_model_path

    argv = ["--runs", "1", "--max-tokens", "12", "--modes", "plain,draft,auto", "--workloads"]
    argv += ["chat", "--json", "--draft-model", str(default_model_path())]
    assert speculative.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    chat = result["workloads"]["chat"]
    assert chat["identical"] is True and chat["draft"]["drafted"] == 0
    assert result["draft_model"]["name"] == default_model_path().name
    assert "--draft-model" in result["command"]
    with pytest.raises(SystemExit, match="go together"):
        speculative.main(["--runs", "1", "--modes", "plain,draft", "--workloads", "chat"])


def test_model_takes_another_gguf_and_names_it(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--model: a hybrid in the tiny Qwen3.5 shape (random weights, whose greedy replies
    repeat, so lookup drafts); every mode's tokens equal plain decoding's, the JSON names
    the file and the command carries the flag. `repeat` (asked for by name: the defaults
    leave it out) asks the same question twice, so every drafted token of the second reply
    is accepted."""
    from bench.shapes import SHAPES
    from bench.shapes_gguf import write_gguf

    path = write_gguf(SHAPES["tiny-qwen3.5"], tmp_path / "hybrid.gguf")
    argv = ["--model", str(path), "--runs", "1", "--max-tokens", "24", "--backend", "numpy"]
    assert speculative.main([*argv, "--workloads", "regenerate,repeat", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    regenerate, repeat = result["workloads"]["regenerate"], result["workloads"]["repeat"]
    assert result["model"]["name"] == "hybrid.gguf" and f"--model {path}" in result["command"]
    assert regenerate["identical"] is True and regenerate["auto"]["drafted"] > 0
    assert repeat["identical"] is True and repeat["auto"]["accepted"] == repeat["auto"]["drafted"]
    assert repeat["auto"]["drafted"] >= repeat["tokens"] // 2
    assert "repeat" not in speculative.DEFAULT_WORKLOADS  # a ceiling, not a user's figure
    assert "regenerate" in speculative.DEFAULT_WORKLOADS
