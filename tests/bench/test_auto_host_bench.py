"""`python -m bench auto_host`: Auto's lookup bookkeeping run step by step as queued plain
steps run it, with a GPU round's cost table. Repeated text gives lookup matches its cut
keeps at flat (GPU-like) costs and drops at a CPU's; fresh prose keeps next to none. No
timing is asserted, only that one is reported."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import auto_host
from engine.default_model import is_default_model_present


def _costs(tmp_path, per_row: float):
    """1 ms a row plus `per_row` a row more (0.03: nearly flat; 1.0: a row costs a step)."""
    table = {str(m): 1e-3 * (1 + per_row * (m - 1)) for m in (1, 2, 4, 8, 16)}
    path = tmp_path / f"costs-{per_row}.json"
    path.write_text(json.dumps({"calibrated_cost_s": table}))
    return path


def test_repeated_text_is_kept_at_flat_costs_and_dropped_at_linear_ones(tmp_path):
    phrase = [int(t) for t in np.random.default_rng(2).integers(10, 5000, 40)]
    ids = phrase * 6  # a reply that repeats its prompt, phrase after phrase
    flat = auto_host.bookkeeping(ids, 40, auto_host.gpu_costs(_costs(tmp_path, 0.03)))
    linear = auto_host.bookkeeping(ids, 40, auto_host.gpu_costs(_costs(tmp_path, 1.0)))
    assert flat[1] > 100 and linear[1] == 0
    assert flat[0] > 0 and linear[0] > 0
    fresh = [int(t) for t in np.random.default_rng(3).integers(10, 5000, 400)]
    assert auto_host.bookkeeping(fresh, 40, auto_host.gpu_costs(_costs(tmp_path, 0.03)))[1] == 0


@pytest.mark.skipif(not is_default_model_present(), reason="the default model's tokenizer")
def test_the_bench_reports_a_steps_microseconds(tmp_path, capsys):
    argv = ["--costs", str(_costs(tmp_path, 0.03)), "--tokens", "300", "--runs", "2", "--json"]
    assert auto_host.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokens"] == 300 and result["step_us"]["median"] > 0
    assert result["command"].startswith("python -m bench auto_host --costs")
