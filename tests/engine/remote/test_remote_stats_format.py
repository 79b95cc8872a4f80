"""How a remote reply's figures read: the server's labelled as the server's, unreported
ones absent rather than zero, a local reply's dict unchanged."""

from __future__ import annotations

from engine.events import Stats
from engine.stats_format import (
    final_line,
    json_figures,
    message_line,
    message_tooltip,
    stats_dict,
    terminal_line,
)


def remote_stats(reported=("prompt_tokens", "cached_tokens", "completion_tokens")) -> Stats:
    return Stats(
        request_id="r", prompt_tokens=1260, generated_tokens=41, reused_tokens=1204,
        prefilled_tokens=56, ttft_s=0.21, prefill_tok_s=0.0, decode_tok_s=38.25, drafted=0,
        accepted=0, context_tokens=1301, context_length=0, server="gpu-box:8000",
        server_reported=reported,
    )  # fmt: skip


def test_vllm_like_figures_name_the_cache():
    d = stats_dict(remote_stats())
    assert message_line(d) == (
        "41 tok · 38.2 tok/s · TTFT 0.21 s · server: 1,204 of 1,260 prompt tokens cached"
    )
    assert final_line(d) == "38.2 tok/s · TTFT 0.21 s · server: 1,204 of 1,260 prompt tokens cached"
    assert (
        "Answered by the server at gpu-box:8000. Tokens, TTFT and decode speed were measured "
        "here, from sending the request to the last word. The server reported 1,260 prompt "
        "tokens, 1,204 of them from its prefix cache (computed before: no work)."
    ) in message_tooltip(d)


def test_a_server_that_reports_nothing_is_not_given_zeros():
    s = remote_stats(reported=())
    assert message_line(stats_dict(s)).endswith("· server: no prompt figures")
    assert terminal_line(s) == (
        "[server gpu-box:8000 · TTFT 0.21 s · decode 38.2 tok/s (measured here) · 41 tokens · "
        "server: no prompt figures]"
    )
    figures = json_figures(s)
    assert figures["prompt_tokens"] is None and figures["cached_tokens"] is None
    assert figures["server"] == "gpu-box:8000" and figures["server_reported"] == []
    assert "(one token a streamed chunk)" in message_tooltip(stats_dict(s))


def test_a_local_replys_dict_has_no_server_keys():
    local = Stats("r", 10, 5, 2, 8, 0.1, 100.0, 20.0, 0, 0, 15, 2048)
    d = stats_dict(local)
    assert "server" not in d and "server_reported" not in d
    assert "server" not in json_figures(local)
