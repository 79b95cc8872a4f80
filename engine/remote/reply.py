"""One streamed remote reply: its chunks become `Tokens` events, and its figures a
`Stats` that says which came from the server.

Thinking comes two ways: as `reasoning_content` (llama-server, vLLM and SGLang with a
reasoning parser; `reasoning` on Ollama) beside the answer's `content`, or inline as a
`<think>` block in the content, which engine/thinking.py's splitter takes apart as it
does for the local engine. The server sends text, not token ids, so each chunk with text
counts as one token (servers stream one token a chunk) until the usage says otherwise.
TTFT and decode speed are measured here, from sending the request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from engine import events as ev
from engine.events import FinishReason, ReplyPart
from engine.remote.server_figures import ServerFigures, read_figures
from engine.thinking import ThinkingSplitter

FINISH_REASONS = {"stop": FinishReason.EOS, "length": FinishReason.LENGTH}


class RemoteReply:
    def __init__(self, request_id: str, emit: Callable[[ev.Event], None]) -> None:
        self.request_id = request_id
        self._emit = emit
        self._splitter = ThinkingSplitter()
        self._texts: dict[str, list[str]] = {ReplyPart.THINKING: [], ReplyPart.ANSWER: []}
        self.sent_at = time.perf_counter()
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.num_chunks = 0  # chunks that carried text: one token each on every server seen
        self.num_thinking_chunks = 0
        self.finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._timings: dict[str, Any] | None = None

    @property
    def answer(self) -> str:
        return "".join(self._texts[ReplyPart.ANSWER])

    @property
    def thinking(self) -> str:
        return "".join(self._texts[ReplyPart.THINKING])

    @property
    def has_text(self) -> bool:
        return self.num_chunks > 0

    def add(self, chunk: Any) -> None:
        """One ChatCompletionChunk of the openai client."""
        extra = chunk.model_extra or {}
        if chunk.usage is not None:
            self._usage = chunk.usage.model_dump()
        if isinstance(extra.get("timings"), dict):  # llama-server, on the last chunk
            self._timings = extra["timings"]
        if isinstance(extra.get("prompt_progress"), dict):  # llama-server's return_progress
            self._progress(extra["prompt_progress"])
        if not chunk.choices:
            return
        choice = chunk.choices[0]
        if choice.finish_reason:
            self.finish_reason = choice.finish_reason
        delta = choice.delta
        delta_extra = delta.model_extra or {}
        reasoning = delta_extra.get("reasoning_content") or delta_extra.get("reasoning")
        if reasoning or delta.content:
            self._count(is_thinking=bool(reasoning) or self._splitter.part == ReplyPart.THINKING)
        if isinstance(reasoning, str) and reasoning:
            self._send([(ReplyPart.THINKING, reasoning)])
        if delta.content:
            self._send(self._splitter.feed(delta.content))

    def finish(self) -> None:
        """The stream ended: text the splitter held back (a possible tag) goes out."""
        self._send(self._splitter.flush())

    def reason(self, *, stopped: bool) -> str:
        if stopped:
            return FinishReason.STOPPED.value
        return FINISH_REASONS.get(self.finish_reason or "stop", FinishReason.EOS).value

    def figures(self) -> ServerFigures:
        return read_figures(self._usage, self._timings)

    def stats(self, *, server: str, context_length: int) -> ev.Stats:
        """Client-measured speed beside the server's prompt figures, labelled as such."""
        figures = self.figures()
        generated = figures.completion_tokens
        if generated is None:
            generated = self.num_chunks
        ttft = (self.first_at - self.sent_at) if self.first_at is not None else 0.0
        decode_s = (self.last_at or 0.0) - (self.first_at or 0.0)
        # the tokens after the first, over the time after it (the local engine's measure)
        decode_tok_s = (generated - 1) / decode_s if generated > 1 and decode_s > 0 else 0.0
        prompt = figures.prompt_tokens or 0
        cached = figures.cached_tokens or 0
        return ev.Stats(
            request_id=self.request_id,
            prompt_tokens=prompt,
            generated_tokens=generated,
            reused_tokens=cached,
            prefilled_tokens=max(prompt - cached, 0),
            ttft_s=ttft,
            prefill_tok_s=figures.prefill_tok_s or 0.0,
            decode_tok_s=decode_tok_s,
            drafted=0,
            accepted=0,
            context_tokens=prompt + generated if prompt else 0,
            context_length=context_length,
            thinking_tokens=self.num_thinking_chunks,
            server=server,
            server_reported=figures.reported(),
        )

    def _progress(self, progress: dict[str, Any]) -> None:
        """llama-server counts the cached tokens in `total` and `processed`; the event
        counts the tokens to compute apart from those reused (as the local engine's)."""
        try:
            total, cached, processed = (int(progress[k]) for k in ("total", "cache", "processed"))
        except (KeyError, TypeError, ValueError):  # another server's shape: no progress shown
            return
        to_compute = max(total - cached, 0)
        done = min(max(processed - cached, 0), to_compute)
        self._emit(ev.PrefillProgress(self.request_id, done, to_compute, cached))

    def _count(self, *, is_thinking: bool) -> None:
        now = time.perf_counter()
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        self.num_chunks += 1
        self.num_thinking_chunks += is_thinking

    def _send(self, segments: list[tuple[str, str]]) -> None:
        for part, text in segments:
            if not text:
                continue
            self._texts[ReplyPart(part)].append(text)
            plain = ReplyPart(part).value  # events carry plain str, not the enum member
            # no token ids: the server sends text; the piece marks one token's worth
            self._emit(ev.Tokens(self.request_id, text, (), (), (text,), part=plain))
