"""A request's figures (its Stats) as people and programs read them: the one formatter
for the terminal's line, `generate --json`'s "stats" object, and the app's lines (a
message's details line, the live and final status line). No Qt, no I/O.

The app keeps a message's Stats as a dict (`stats_dict`, stored as JSON), so its lines
read that dict; the terminal formats the event's Stats directly."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from engine.events import Stats


def terminal_line(s: Stats) -> str:
    """ "[52 prompt tokens (0 reused) · TTFT 0.23 s · prefill 226.1 tok/s · decode 41.3 tok/s ·
    164 tokens · accepted 61/88 drafted]", printed after a reply in the terminal."""
    drafted = f" · accepted {s.accepted}/{s.drafted} drafted" if s.drafted else ""
    return (
        f"[{s.prompt_tokens} prompt tokens ({s.reused_tokens} reused) · TTFT {s.ttft_s:.2f} s · "
        f"prefill {s.prefill_tok_s:.1f} tok/s · decode {s.decode_tok_s:.1f} tok/s · "
        f"{s.generated_tokens} tokens{drafted}]"
    )


def json_figures(s: Stats) -> dict[str, Any]:
    """`python -m engine generate --json`'s "stats" object (rounded for reading)."""
    return {
        "prompt_tokens": s.prompt_tokens,
        "generated_tokens": s.generated_tokens,
        "ttft_s": round(s.ttft_s, 4),
        "prefill_tok_s": round(s.prefill_tok_s, 2),
        "decode_tok_s": round(s.decode_tok_s, 2),
        "drafted": s.drafted,
        "accepted": s.accepted,
    }


def stats_dict(stats: Stats, *, reason: str = "") -> dict[str, Any]:
    """What a message keeps of a request's Stats (stored as JSON)."""
    out: dict[str, Any] = asdict(stats)
    out.pop("request_id", None)
    if reason:
        out["reason"] = reason
    return out


def message_line(stats: dict[str, Any] | None) -> str:
    """ "41 tok · 38.2 tok/s · TTFT 0.21 s · 62% drafted"."""
    if not stats:
        return ""
    generated = int(stats.get("generated_tokens", 0))
    parts = [f"{generated} tok"]
    if stats.get("decode_tok_s"):
        parts.append(f"{stats['decode_tok_s']:.1f} tok/s")
    if stats.get("ttft_s") is not None:
        parts.append(f"TTFT {stats['ttft_s']:.2f} s")
    accepted = int(stats.get("accepted", 0))
    if generated and accepted:
        parts.append(f"{round(100 * accepted / generated)}% drafted")
    return " · ".join(parts)


def live_line(
    *,
    tok_s: float | None,
    ttft_s: float | None,
    acceptance: float | None = None,
    drafted_fraction: float | None = None,
    context_tokens: int | None = None,
    context_length: int | None = None,
) -> str:
    """ "36.9 tok/s · TTFT 0.19 s · accepted 71% · ctx 4.1k/8k"."""
    parts = []
    if tok_s is not None:
        parts.append(f"{tok_s:.1f} tok/s")
    if ttft_s is not None:
        parts.append(f"TTFT {ttft_s:.2f} s")
    if acceptance is not None:
        parts.append(f"accepted {round(100 * acceptance)}%")
    elif drafted_fraction:
        parts.append(f"{round(100 * drafted_fraction)}% drafted")
    if context_tokens is not None and context_length:
        parts.append(f"ctx {compact(context_tokens)}/{compact(context_length)}")
    return " · ".join(parts)


def final_line(stats: dict[str, Any]) -> str:
    """The status line after a request: its figures, reuse included."""
    acceptance = None
    if stats.get("drafted"):
        acceptance = stats.get("accepted", 0) / stats["drafted"]
    line = live_line(
        tok_s=stats.get("decode_tok_s"),
        ttft_s=stats.get("ttft_s"),
        acceptance=acceptance,
        context_tokens=stats.get("context_tokens"),
        context_length=stats.get("context_length"),
    )
    reuse = (
        f"reused {stats.get('reused_tokens', 0):,} · prefilled {stats.get('prefilled_tokens', 0):,}"
    )
    return f"{line} · {reuse}" if line else reuse


def compact(n: int) -> str:
    """512 -> '512', 4130 -> '4.1k', 8192 -> '8k' (a power-of-two size reads in KiB)."""
    if n < 1000:
        return str(n)
    if n % 1024 == 0:
        return f"{n // 1024}k"
    if n < 100_000:
        return f"{n / 1000:.1f}k".replace(".0k", "k")
    return f"{round(n / 1000)}k"


def parameters(n: int) -> str:
    """134515008 -> '135M'."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B".replace(".0B", "B")
    if n >= 1e6:
        return f"{round(n / 1e6)}M"
    return f"{round(n / 1e3)}K"
