"""`python -m bench sampling` on a tiny model: the engine's draw and the plain form give
the same token from every row of the reply, for every setting, and the figures are the
ones the docs quote."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import sampling
from engine.sampling import PositionalUniforms, SamplingSettings, sample


def test_the_bench_draws_the_same_tokens_both_ways(tiny_llama_q4_gguf, capsys) -> None:
    path, _spec = tiny_llama_q4_gguf
    argv = ["--model", str(path), "--rows", "6", "--runs", "1", "--json", "--backend", "numpy"]
    assert sampling.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == 6 and set(out["draws"]) == set(sampling.SETTINGS)
    for figures in out["draws"].values():
        assert figures["same_tokens"] is True
        assert figures["ms_a_draw"] > 0 and figures["plain_ms_a_draw"] > 0
    # the nucleus setting's draws from the device's pack: decided, and the engine's tokens
    nucleus = out["draws"]["t0.7-top_p0.95"]
    assert nucleus["pack_same_tokens"] is True and nucleus["pack_decided"] >= 1
    assert "pack_ms_a_draw" not in out["draws"]["t1.0"]


@pytest.mark.parametrize("name", sorted(sampling.SETTINGS))
def test_the_plain_form_is_the_engines_draw(name: str) -> None:
    """On peaked and flat rows of a 49,152-token vocabulary, at many positions (so many
    uniforms): the plain form (full sorts, the whole CDF) draws the engine's token."""
    s: SamplingSettings = sampling.SETTINGS[name]
    u = PositionalUniforms(s.seed)
    rng = np.random.default_rng(3)
    for scale in (0.5, 3.0, 8.0):
        row = (rng.standard_normal(49152) * scale).astype(np.float32)
        for position in range(0, 400, 7):
            history = [1] * position
            assert sample(row, history, s, u) == sampling.plain_sample(row, history, s, u)
