"""A `Generate` as a chat-completions request: the branch's messages and the sampling
settings, in the fields OpenAI's API defines plus the extra ones servers accept.

The extra fields (`extra_body`) are those llama-server, vLLM and SGLang read: top_k,
min_p, the repetition penalty under both names (llama-server's `repeat_penalty`, vLLM's
and SGLang's `repetition_penalty`; each server ignores the name it does not know),
`cache_prompt` (llama-server reuses its KV cache for the longest common prefix, so an
edit or a branch switch recomputes only what changed), `return_progress` (llama-server
streams the prompt's progress, shown as the local engine's prefill progress), and
`chat_template_kwargs` for a reasoning model's thinking switch. A sampling setting at its
neutral value is not sent, so a strict server only sees those fields when they matter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine import events as ev


def chat_request(
    model: str,
    messages: Sequence[ev.Message],
    settings: ev.GenerationSettings,
    *,
    stop: Sequence[str] = (),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the create() keywords, the extra_body) of one streamed chat completion."""
    s = settings.sampling
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "stream": True,
        "stream_options": {"include_usage": True},  # the last chunk carries the usage
        "temperature": s.temperature,
        "top_p": s.top_p,
        "max_tokens": settings.max_tokens,
    }
    if s.seed is not None:
        body["seed"] = s.seed
    if stop:
        body["stop"] = list(stop)
    # llama-server: reuse the cached prefix, and stream the prompt's progress before text
    extra: dict[str, Any] = {"cache_prompt": True, "return_progress": True}
    if s.top_k:
        extra["top_k"] = s.top_k
    if s.min_p:
        extra["min_p"] = s.min_p
    if s.repetition_penalty != 1.0:
        extra["repeat_penalty"] = s.repetition_penalty
        extra["repetition_penalty"] = s.repetition_penalty
        extra["repeat_last_n"] = s.repetition_context
    if settings.enable_thinking is not None:
        extra["chat_template_kwargs"] = {"enable_thinking": settings.enable_thinking}
    return body, extra


def refusal(settings: ev.GenerationSettings) -> str | None:
    """Why a request cannot go to a remote server as asked, or None when it can."""
    if settings.continue_last:
        return (
            "Continue is not available on a remote server: the chat-completions API "
            "always starts a new reply. Regenerate the message instead."
        )
    if settings.drop_oldest_turns:
        return (
            "Dropping the oldest turns is not available on a remote server (it renders "
            "the prompt itself). Turn it off in the chat's settings, or start a new chat."
        )
    return None
