"""bench/gpu/host_probe.py on a tiny model: the decode steps it profiles are the runner's
(its forward ranks among the functions with callees, called once a step) and its figures
are per step."""

from __future__ import annotations

from typing import Any

from bench.gpu.host_probe import probe


def test_the_probe_ranks_the_runners_forward_once_a_step(tiny_llama_q4_gguf):
    path, _spec = tiny_llama_q4_gguf
    out = probe(str(path), context=16, steps=12, top=30)
    assert out["steps"] == 12 and out["context"] == 16 and out["step_us"] > 0
    forwards = [r for r in out["by_time_with_callees"] if r["function"].endswith(":forward")]
    assert forwards and any(r["calls_a_step"] == 1.0 for r in forwards)
    assert len(out["by_own_time"]) == 30  # a step calls more functions than that on any path
    own = [r["own_us"] for r in out["by_own_time"]]
    assert own == sorted(own, reverse=True)
    assert all(r["with_callees_us"] <= out["profiled_step_us"] * 1.01 for r in forwards)


def test_the_loop_probe_takes_a_replys_queued_steps_and_the_hosts_draws(
    tiny_llama_q4_gguf, monkeypatch
):
    """With `--loop` on MLX the steps are the decode loop's: each one launched (queued
    ahead of the host) and, sampled, each token drawn by the host once (and the loop's
    first token, which no step of the run computes), from the step's pack."""
    from engine.sampling import SamplingSettings

    monkeypatch.setenv("BRANCHCHAT_BACKEND", "mlx")
    path, _spec = tiny_llama_q4_gguf
    sampled = SamplingSettings(temperature=0.7, top_p=0.95, seed=0)
    out = probe(str(path), context=16, steps=12, top=80, settings=sampled)
    assert out["loop"] == repr(sampled) and out["step_us"] > 0
    calls = {r["function"].rsplit(":", 1)[-1]: r["calls_a_step"] for r in out["by_own_time"]}
    calls.update(
        {r["function"].rsplit(":", 1)[-1]: r["calls_a_step"] for r in out["by_time_with_callees"]}
    )
    assert calls["launch"] == 1.0
    # a nucleus draw from each step's pack (engine/sampling_candidates.py), from a whole
    # row for the loop's first token and where a pack cannot tell
    assert calls["decide"] == 1.0
    assert round(1 / 12, 2) <= calls["sample"] < 1.0


def test_the_loop_split_times_each_mode_and_restores_what_it_timed(tiny_llama_q4_gguf, monkeypatch):
    """bench/gpu/loop_probe.py: per mode the device's time a step and the loop's, the
    host's launches, reads and (sampled) draws within the loop's wall time; the engine's
    functions it wrapped are the originals again after it."""
    from bench.gpu import loop_probe
    from engine import sampling_candidates, verify_rows
    from engine.runner import ahead
    from engine.suffix_drafter import SuffixDrafter

    monkeypatch.setenv("BRANCHCHAT_BACKEND", "mlx")
    path, _spec = tiny_llama_q4_gguf
    read, draw = ahead.Launch.read, verify_rows.host_draw
    loaded: list[Any] = []
    real_load = loop_probe.load_model

    def load(*args: Any) -> Any:
        loaded.append(real_load(*args))
        return loaded[-1]

    monkeypatch.setattr(loop_probe, "load_model", load)
    propose, decide = SuffixDrafter.propose, sampling_candidates.decide
    out = loop_probe.probe(str(path), context=16, steps=6, lookup=True)
    assert ahead.Launch.read is read and verify_rows.host_draw is draw
    assert SuffixDrafter.propose is propose and sampling_candidates.decide is decide
    assert "launch" not in vars(loaded[0].runner)  # the runner's method is its class's again
    for mode in ("greedy", "sampled"):
        split = out[mode]
        assert split["device_us"] >= split["device_launch_us"] > 0 and split["loop_us"] > 0
        parts = split["launch_us"] + split["read_us"] + split.get("host_draw_us", 0.0)
        assert 0 < parts <= split["loop_us"]
        # the plain loop calls no drafter; lookup's commits and proposals are timed
        plain, lookup = out[f"{mode}_lookup"]["plain"], out[f"{mode}_lookup"]["lookup"]
        assert "commit_us" not in plain and plain["drafted"] == 0
        assert lookup["commit_us"] > 0 and lookup["propose_us"] > 0 and lookup["loop_us"] > 0
    assert "host_draw_us" not in out["greedy"] and out["sampled"]["host_draw_us"] > 0
    # the draw's parts: its pack read and the decision from it, within the draw
    sampled = out["sampled"]
    assert 0 < sampled["read_pack_us"] + sampled["decide_us"] <= sampled["host_draw_us"]
