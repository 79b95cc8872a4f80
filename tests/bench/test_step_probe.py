"""bench/gpu/step_probe.py's reading of the stamped build's cycle stamps (bench/gpu/
step_stamps.py): which phase each stamp row is, for every family the step takes, and the
per-phase medians it reports from a synthetic stamp table."""

from __future__ import annotations

import numpy as np

from bench.gpu.step_probe import summarize
from bench.gpu.step_stamps import num_stamps, phases
from tests.kernels.test_fused_step_source import SMOLLM2, TINY_GEMMA3, TINY_QWEN35


def test_each_barrier_is_named_by_its_layers_kind():
    plain = phases(SMOLLM2, 2)
    assert [name for _, name in plain] == [
        "embed", *["A_qkv", "B_attention", "C_o_proj", "D_gate_up", "E_down"] * 2, "head",
    ]  # fmt: skip
    hybrid = phases(TINY_QWEN35, 4)  # layers 0-2 Gated DeltaNet, 3 gated attention
    assert hybrid[1:6] == [(0, n) for n in ("G1_in_proj", "G2_recurrence", "G3_out_proj",
                                            "D_gate_up", "E_down")]  # fmt: skip
    assert [n for layer, n in hybrid if layer == 3] == [
        "A_qkv",
        "A2_qk_norm",
        "B_attention",
        "C_o_proj",
        "D_gate_up",
        "E_down",
    ]
    gemma = phases(TINY_GEMMA3, 6)
    assert [n for layer, n in gemma if layer == 0] == [
        "A_qkv", "A2_qk_norm", "B_attention", "C_o_proj", "C2_post_norm", "D_gate_up",
        "E_down", "E2_post_norm",
    ]  # fmt: skip
    assert len(gemma) == 1 + 6 * 8 + 1 and gemma[-1] == (6, "head")


def test_the_summary_takes_each_phases_rows_across_layers():
    rows = phases(TINY_QWEN35, 4)
    blocks, slots = 3, len(rows)
    stamps = np.zeros(num_stamps(slots, blocks), dtype=np.uint32)
    table = stamps[: slots * (blocks + 1)].reshape(slots, blocks + 1)
    for i, (layer, _name) in enumerate(rows):
        table[i, 0] = 1000 * (i + 1)  # block 0's interval
        table[i, 1:] = [100 * (layer + 2), 200 * (layer + 2), 300 * (layer + 2)]
    stamps[slots * (blocks + 1) :] = [2_000_000, 4_000_000]  # ns, cycles: 0.5 ns a cycle
    out = summarize(stamps, rows, blocks)
    assert out["kernel_us"] == 2000 and out["ghz"] == 2.0
    g2 = [i for i, (_, n) in enumerate(rows) if n == "G2_recurrence"]  # rows 2, 7, 12
    assert out["G2_recurrence"]["layers"] == 3
    assert out["G2_recurrence"]["interval"] == 1000 * (g2[1] + 1) * 0.5 / 1000
    assert out["G2_recurrence"]["max_work"] == 300 * 3 * 0.5 / 1000  # layer 1's, the median
    assert out["A2_qk_norm"]["layers"] == 1 and out["D_gate_up"]["layers"] == 4
    assert "interval" not in out["head"] and out["head"]["max_work"] == 300 * 6 * 0.5 / 1000
