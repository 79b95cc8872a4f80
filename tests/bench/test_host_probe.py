"""bench/gpu/host_probe.py on a tiny model: the decode steps it profiles are the runner's
(its forward ranks among the functions with callees, called once a step) and its figures
are per step."""

from __future__ import annotations

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
