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
    if s.server:
        return (
            f"[server {s.server} · TTFT {s.ttft_s:.2f} s · decode {s.decode_tok_s:.1f} tok/s "
            f"(measured here) · {s.generated_tokens} tokens · {server_prompt(asdict(s))}]"
        )
    drafted = f" · accepted {s.accepted}/{s.drafted} drafted" if s.drafted else ""
    memory = memory_line(asdict(s))
    return (
        f"[{s.prompt_tokens} prompt tokens ({s.reused_tokens} reused) · TTFT {s.ttft_s:.2f} s · "
        f"prefill {s.prefill_tok_s:.1f} tok/s · decode {s.decode_tok_s:.1f} tok/s · "
        f"{s.generated_tokens} tokens{drafted}{' · ' + memory if memory else ''}]"
    )


def json_figures(s: Stats) -> dict[str, Any]:
    """`python -m engine generate --json`'s "stats" object (rounded for reading), with the
    state's bytes by part when they were measured."""
    figures: dict[str, Any] = {
        "prompt_tokens": s.prompt_tokens,
        "generated_tokens": s.generated_tokens,
        "ttft_s": round(s.ttft_s, 4),
        "prefill_tok_s": round(s.prefill_tok_s, 2),
        "decode_tok_s": round(s.decode_tok_s, 2),
        "drafted": s.drafted,
        "accepted": s.accepted,
        "verifies": s.verifies,
    }
    if s.server:  # which figures are the server's; unreported ones are null, not 0
        figures["server"] = s.server
        figures["server_reported"] = list(s.server_reported)
        if "prompt_tokens" not in s.server_reported:
            figures["prompt_tokens"] = None
        cached = "cached_tokens" in s.server_reported
        figures["cached_tokens"] = s.reused_tokens if cached else None
    if s.memory_budget_bytes:
        figures["memory_bytes"] = {
            "kv": s.kv_bytes,
            "snapshots": s.snapshot_bytes,
            "branch_cache": s.branch_cache_bytes,
            "drafter": s.drafter_bytes,
            "total": s.memory_bytes,
            "budget": s.memory_budget_bytes,
        }
    return figures


def stats_dict(stats: Stats, *, reason: str = "") -> dict[str, Any]:
    """What a message keeps of a request's Stats (stored as JSON)."""
    out: dict[str, Any] = asdict(stats)
    out.pop("request_id", None)
    if not stats.server:  # a local request's dict stays as it always was
        out.pop("server", None)
        out.pop("server_reported", None)
    if reason:
        out["reason"] = reason
    return out


def message_line(stats: dict[str, Any] | None) -> str:
    """A reply's footer: "41 tok · 38.2 tok/s · TTFT 0.21 s · reused 1,204 / prefilled 56 ·
    25/40 drafts accepted"; `message_tooltip` says what each figure means."""
    if not stats:
        return ""
    generated = int(stats.get("generated_tokens", 0))
    parts = [f"{generated} tok"]
    if stats.get("decode_tok_s"):
        parts.append(f"{stats['decode_tok_s']:.1f} tok/s")
    if stats.get("ttft_s") is not None:
        parts.append(f"TTFT {stats['ttft_s']:.2f} s")
    if stats.get("server"):
        parts.append(server_prompt(stats))
    elif "prefilled_tokens" in stats:
        parts.append(
            f"reused {stats.get('reused_tokens', 0):,} / prefilled {stats['prefilled_tokens']:,}"
        )
    accepted, drafted = int(stats.get("accepted", 0)), stats.get("drafted")
    if drafted:
        parts.append(f"{accepted}/{drafted} drafts accepted")
    elif drafted is None and accepted:  # measured in the window: proposals not known
        parts.append(f"{accepted} tok from drafts")
    return " · ".join(parts)


def message_tooltip(stats: dict[str, Any] | None) -> str:
    """What each figure of `message_line` means, one line each, with this reply's numbers.
    Acceptance (of what was drafted) and the drafted share (of the reply) are different
    ratios; both are spelt out so "100% accepted" beside "14% from drafts" reads right."""
    if not stats:
        return ""
    generated = int(stats.get("generated_tokens", 0))
    parts = int(stats.get("parts", 1))
    lines = [f"{generated} tokens generated" + (
        f" over {parts} requests: the reply and its continuation, both parts counted."
        if parts > 1 else ".")]  # fmt: skip
    if stats.get("thinking_tokens"):
        lines.append(f"{stats['thinking_tokens']} of them in the thinking block, above the answer.")
    if stats.get("decode_tok_s"):
        lines.append(
            f"{stats['decode_tok_s']:.1f} tok/s: decode speed, tokens per second after the first."
        )
    if stats.get("ttft_s") is not None:
        lines.append(
            f"TTFT {stats['ttft_s']:.2f} s: time to first token, from sending to the first "
            "word (computing the prompt included)."
        )
    if stats.get("server"):
        lines.append(server_tooltip(stats))
    elif "prefilled_tokens" in stats:
        lines.append(
            f"{stats.get('reused_tokens', 0):,} prompt tokens reused from the computed state "
            f"(no work); {stats['prefilled_tokens']:,} prompt tokens computed (prefilled)"
            + (" over all requests" if parts > 1 else "")
            + (
                f", {stats['replayed_tokens']:,} of them replayed to bring the state back to the "
                "edit point."
                if stats.get("replayed_tokens")
                else "."
            )
        )
    accepted, drafted = int(stats.get("accepted", 0)), stats.get("drafted")
    if drafted:
        lines.append(
            f"{accepted} of {drafted} drafted tokens accepted ({_percent(accepted, drafted)}): "
            "speculative decoding guesses tokens (prompt lookup or a draft model) and the "
            "model checks them all in one pass, keeping those it would have written itself."
        )
    if accepted and generated:
        lines.append(
            f"{accepted} of this reply's {generated} tokens ({_percent(accepted, generated)}) "
            "came from accepted drafts (tinted in the text); the rest the model wrote one "
            "step at a time."
        )
    if stats.get("source") == "window":
        lines.append(
            "Measured in the window: the app closed before the engine reported its figures."
        )
    return "\n".join(lines)


def server_prompt(stats: dict[str, Any]) -> str:
    """A remote reply's prompt figures, as the server reported them: "server: 1,204 of
    1,260 prompt tokens cached", "server: 52 prompt tokens", "server: no prompt figures"."""
    reported = stats.get("server_reported") or ()
    prompt = int(stats.get("prompt_tokens", 0))
    if "cached_tokens" in reported:
        return f"server: {int(stats.get('reused_tokens', 0)):,} of {prompt:,} prompt tokens cached"
    if "prompt_tokens" in reported:
        return f"server: {prompt:,} prompt tokens"
    return "server: no prompt figures"


def server_tooltip(stats: dict[str, Any]) -> str:
    """Where a remote reply's figures come from, for the message's tooltip."""
    reported = stats.get("server_reported") or ()
    line = (
        f"Answered by the server at {stats['server']}. Tokens, TTFT and decode speed were "
        "measured here, from sending the request to the last word"
    )
    if "completion_tokens" not in reported:
        line += " (one token a streamed chunk)"
    prompt = int(stats.get("prompt_tokens", 0))
    if "cached_tokens" in reported:
        cached = int(stats.get("reused_tokens", 0))
        return (
            f"{line}. The server reported {prompt:,} prompt tokens, {cached:,} of them from "
            "its prefix cache (computed before: no work)."
        )
    if "prompt_tokens" in reported:
        return f"{line}. The server reported {prompt:,} prompt tokens, but not how many it cached."
    return f"{line}. The server reported no prompt figures (how many tokens, how many cached)."


def _percent(part: int, whole: int) -> str:
    return f"{round(100 * part / whole)}%" if whole else "0%"


def live_line(
    *,
    tok_s: float | None,
    ttft_s: float | None,
    acceptance: float | None = None,
    drafted_fraction: float | None = None,
    context_tokens: int | None = None,
    context_length: int | None = None,
) -> str:
    """ "36.9 tok/s · TTFT 0.19 s · 71% of drafts accepted · ctx 4.1k/8k"."""
    parts = []
    if tok_s is not None:
        parts.append(f"{tok_s:.1f} tok/s")
    if ttft_s is not None:
        parts.append(f"TTFT {ttft_s:.2f} s")
    if acceptance is not None:
        parts.append(f"{round(100 * acceptance)}% of drafts accepted")
    elif drafted_fraction:
        parts.append(f"{round(100 * drafted_fraction)}% from drafts")
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
    if stats.get("server"):
        reuse = server_prompt(stats)
    line = f"{line} · {reuse}" if line else reuse
    memory = memory_line(stats)
    return f"{line} · {memory}" if memory else line


def memory_line(stats: dict[str, Any]) -> str:
    """ "mem 45.2 MiB/4 GiB": what the engine's state holds after the request, of its
    budget ("" for figures without them)."""
    budget = int(stats.get("memory_budget_bytes", 0))
    if not budget and not stats.get("memory_bytes"):
        return ""
    return f"mem {byte_size(int(stats.get('memory_bytes', 0)))}/{byte_size(budget)}"


# (Stats field, what it is) for the memory tooltip, in the order eviction spares them
_MEMORY_PARTS = (
    ("kv_bytes", "live state (KV rows, recurrent state): never evicted"),
    ("drafter_bytes", "lookup drafter's index: evicted last"),
    ("snapshot_bytes", "rollback snapshots: evicted next, oldest position first"),
    ("branch_cache_bytes", "cached sibling branches: evicted first"),
)


def memory_tooltip(stats: dict[str, Any]) -> str:
    """Each part of the state's bytes, one a line, then the total against the budget."""
    if not memory_line(stats):
        return ""
    lines = [f"{byte_size(int(stats.get(key, 0)))}  {what}" for key, what in _MEMORY_PARTS]
    total, budget = int(stats.get("memory_bytes", 0)), int(stats.get("memory_budget_bytes", 0))
    over = " (over it: the live state is never evicted)" if total > budget else ""
    lines.append(f"{byte_size(total)} in all, of a {byte_size(budget)} budget{over}")
    return "Memory held by the model's computed state:\n" + "\n".join(lines)


def byte_size(n: int) -> str:
    """812 -> '812 B', 46_399_488 -> '44.2 MiB', 4 << 30 -> '4 GiB'."""
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    if unit == "B" or size >= 100 or size == int(size):
        return f"{size:.0f} {unit}"
    return f"{size:.1f} {unit}"


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
