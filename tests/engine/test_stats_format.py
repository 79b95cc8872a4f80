"""The one formatter of a request's Stats: the terminal's line and `generate --json`'s
object read exactly as they did when the CLI built them itself."""

from __future__ import annotations

import json

from engine.events import Stats
from engine.stats_format import final_line, json_figures, stats_dict, terminal_line

STATS = Stats(
    request_id="r1",
    prompt_tokens=52,
    generated_tokens=164,
    reused_tokens=12,
    prefilled_tokens=40,
    ttft_s=0.23456,
    prefill_tok_s=226.1234,
    decode_tok_s=41.3333,
    drafted=88,
    accepted=61,
    context_tokens=216,
    context_length=8192,
    verifies=40,
)


def test_the_terminal_line():
    assert terminal_line(STATS) == (
        "[52 prompt tokens (12 reused) · TTFT 0.23 s · prefill 226.1 tok/s · "
        "decode 41.3 tok/s · 164 tokens · accepted 61/88 drafted]"
    )
    plain = Stats("r2", 5, 3, 0, 5, 0.5, 10.0, 20.0, 0, 0, 8, 2048)
    assert terminal_line(plain) == (
        "[5 prompt tokens (0 reused) · TTFT 0.50 s · prefill 10.0 tok/s · "
        "decode 20.0 tok/s · 3 tokens]"
    )


def test_the_json_figures():
    assert json.dumps(json_figures(STATS)) == (
        '{"prompt_tokens": 52, "generated_tokens": 164, "ttft_s": 0.2346, '
        '"prefill_tok_s": 226.12, "decode_tok_s": 41.33, "drafted": 88, "accepted": 61, '
        '"verifies": 40}'
    )
    assert STATS.acceptance_length == (61 + 40) / 40  # tokens a verify yields


def test_the_app_keeps_every_figure_and_reads_its_status_line_from_them():
    record = stats_dict(STATS, reason="eos")
    assert "request_id" not in record and record["reason"] == "eos"
    assert record["context_tokens"] == 216 and record["accepted"] == 61
    assert final_line(record) == (
        "41.3 tok/s · TTFT 0.23 s · 69% of drafts accepted · ctx 216/8k · reused 12 · prefilled 40"
    )
