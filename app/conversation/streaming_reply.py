"""The reply being streamed: its growing text, which characters came from accepted
drafts, and the live speed figures. Plain Python; the controller owns one at a time.

A message keeps one stats dict for its whole text: a continued reply's figures are the
sum of its parts (`combine_stats`), and a reply cut off by the window closing gets the
figures the window measured itself (`window_stats`), since the engine's never came."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.events import Finished, ReplyPart, Tokens
from engine.stats_format import live_line


@dataclass
class StreamingReply:
    request_id: str
    conversation_id: str
    message_id: str
    text: str = ""
    draft_spans: list[tuple[int, int]] = field(default_factory=list)
    base_text: str = ""  # what a continued message already said
    base_stats: dict[str, Any] | None = None  # a continued message's figures so far
    thinking: str = ""  # the reasoning part (ReplyPart.THINKING), kept apart from `text`
    num_thinking_tokens: int = 0
    submitted_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    num_tokens: int = 0
    num_drafted: int = 0
    prefilled_tokens: int = 0  # from the prefill progress: computed, and reused
    reused_tokens: int = 0
    saved_text: str = ""  # what the store holds of it
    saved_thinking: str = ""
    is_stopping: bool = False
    save_failed: bool = False  # the store refused a write of it (reported once)

    @classmethod
    def start(cls, request_id: str, conversation_id: str, message_id: str, base: str, spans,
              base_stats: dict[str, Any] | None = None, base_thinking: str = ""):  # fmt: skip
        return cls(request_id, conversation_id, message_id, text=base, base_text=base,
                   base_stats=base_stats, draft_spans=list(spans), saved_text=base,
                   thinking=base_thinking, saved_thinking=base_thinking)  # fmt: skip

    def fields(self) -> dict[str, Any]:
        """What the store keeps of the reply so far (update_message's keywords)."""
        return {"content": self.text, "draft_spans": self.spans, "thinking": self.thinking}

    def on_prefill(self, total: int, reused: int) -> None:
        """PrefillProgress's `total` counts the tokens to compute; `reused` the rest."""
        self.prefilled_tokens, self.reused_tokens = total, reused

    def whole_reply_stats(self, stats: dict[str, Any] | None) -> dict[str, Any] | None:
        """This request's figures joined to those of the part it continued, if any."""
        if stats is None or not self.base_text or not self.base_stats:
            return stats
        return combine_stats(self.base_stats, stats)

    def window_stats(self) -> dict[str, Any] | None:
        """Figures measured here, for a reply whose engine figures never arrived."""
        if self.first_token_at is None:
            return self.base_stats if self.base_text else None
        elapsed = time.monotonic() - self.first_token_at
        stats: dict[str, Any] = {
            "generated_tokens": self.num_tokens,
            "ttft_s": self.first_token_at - self.submitted_at,
            "decode_tok_s": (self.num_tokens - 1) / elapsed if elapsed > 0.05 else 0.0,
            "accepted": self.num_drafted,  # tokens that came from accepted drafts
            "thinking_tokens": self.num_thinking_tokens,
            "reason": "stopped",
            "source": "window",
        }
        if self.prefilled_tokens or self.reused_tokens:
            stats["prompt_tokens"] = self.prefilled_tokens + self.reused_tokens
            stats["reused_tokens"] = self.reused_tokens
            stats["prefilled_tokens"] = self.prefilled_tokens
        return self.whole_reply_stats(stats)

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        return tuple(self.draft_spans)

    def add(self, event: Tokens) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        # a remote server sends text without ids: each of its pieces is one token's worth
        num_tokens = len(event.token_ids) or len(event.pieces)
        if event.part == ReplyPart.THINKING:
            self.thinking += event.text
            self.num_thinking_tokens += num_tokens
            self.num_tokens += num_tokens
            self.num_drafted += sum(event.from_draft)
            return
        start = len(self.text)
        self.text += event.text
        drafted = sum(event.from_draft)
        self.num_tokens += num_tokens
        self.num_drafted += drafted
        if not drafted:
            return
        if len(event.pieces) == len(event.token_ids):  # each token's own text
            at = start
            for piece, from_draft in zip(event.pieces, event.from_draft, strict=True):
                if from_draft:
                    self._mark(at, at + len(piece))
                at += len(piece)
        else:  # an event without pieces: split the drafted share by count
            self._mark(start, start + round(len(event.text) * drafted / len(event.token_ids)))

    def _mark(self, start: int, end: int) -> None:
        """Add [start, end) to the drafted spans, joining it to a span that ends at start."""
        if end <= start:
            return
        if self.draft_spans and self.draft_spans[-1][1] == start:
            self.draft_spans[-1] = (self.draft_spans[-1][0], end)
        else:
            self.draft_spans.append((start, end))

    def live_line(self, context_length: int | None) -> str | None:
        if self.first_token_at is None:
            return None
        elapsed = time.monotonic() - self.first_token_at
        return live_line(
            tok_s=(self.num_tokens - 1) / elapsed if elapsed > 0.05 else None,
            ttft_s=self.first_token_at - self.submitted_at,
            drafted_fraction=self.num_drafted / max(self.num_tokens, 1),
            context_length=context_length,
        )

    def final_text(self, event: Finished) -> tuple[str, tuple[tuple[int, int], ...]]:
        """The message's whole text once the engine is done, and its drafted spans."""
        text = event.text or self.text
        if self.base_text and not text.startswith(self.base_text):
            text = self.base_text + text  # the engine reports only the continuation
        spans = tuple((a, min(b, len(text))) for a, b in self.draft_spans if a < len(text))
        return text, spans

    def final_thinking(self, event: Finished) -> str:
        """The reasoning part once done: the engine's (tags and edge space removed), or,
        for a continuation, what the message had plus what streamed now."""
        return self.thinking if self.base_text or not event.thinking else event.thinking


SUMMED = ("generated_tokens", "prefilled_tokens", "drafted", "accepted", "thinking_tokens")


def combine_stats(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """One message's figures over two requests (a reply and its continuation): token
    counts add up, speed is total tokens over total decode time, the first token is the
    first part's, and prompt reuse and context are the latest request's."""
    out = dict(later)
    for key in SUMMED:
        if key in earlier or key in later:
            if key == "drafted" and (earlier.get(key) is None) != (later.get(key) is None):
                out.pop(key, None)  # one part does not know its proposals: no honest sum
                continue
            out[key] = int(earlier.get(key) or 0) + int(later.get(key) or 0)
    seconds = sum(_decode_seconds(part) for part in (earlier, later))
    if seconds > 0:
        out["decode_tok_s"] = out["generated_tokens"] / seconds
    if earlier.get("ttft_s") is not None:
        out["ttft_s"] = earlier["ttft_s"]
    out["parts"] = int(earlier.get("parts", 1)) + int(later.get("parts", 1))
    return out


def _decode_seconds(stats: dict[str, Any]) -> float:
    rate = stats.get("decode_tok_s") or 0.0
    return int(stats.get("generated_tokens", 0)) / rate if rate > 0 else 0.0
