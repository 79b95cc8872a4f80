"""The prompt figures a server reports about a request, read from its last chunks.

Servers say different things: llama-server sends `timings` (`prompt_n` tokens computed,
`cache_n` taken from its cache, `prompt_per_second`), vLLM and SGLang
`usage.prompt_tokens_details.cached_tokens` (with automatic prefix caching on), most
others only `usage.prompt_tokens`, and llama-cpp-python's server nothing while streaming.
What is not reported stays None: the window then says the server did not say, rather
than showing a zero it never measured.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class ServerFigures:
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    prefill_tok_s: float | None = None

    def reported(self) -> tuple[str, ...]:
        """The names of the figures the server gave."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is not None)


def read_figures(usage: dict[str, Any] | None, timings: dict[str, Any] | None) -> ServerFigures:
    """`usage` (the OpenAI field) and `timings` (llama-server's), as plain dicts."""
    usage, timings = usage or {}, timings or {}
    prompt = _int(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details") or {}
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    completion = _int(usage.get("completion_tokens"))
    prefill_rate = None
    if "prompt_n" in timings:  # llama-server: computed + cached make the whole prompt
        computed, cache_n = _int(timings.get("prompt_n")), _int(timings.get("cache_n"))
        if computed is not None and cache_n is not None:
            prompt, cached = computed + cache_n, cache_n
        rate = timings.get("prompt_per_second")
        prefill_rate = float(rate) if isinstance(rate, int | float) and rate > 0 else None
    if completion is None:
        completion = _int(timings.get("predicted_n"))
    return ServerFigures(prompt, cached, completion, prefill_rate)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
