"""The reply being streamed: its growing text, which characters came from accepted
drafts, and the live speed figures. Plain Python; the controller owns one at a time."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.events import Finished, Tokens
from engine.stats_format import live_line


@dataclass
class StreamingReply:
    request_id: str
    conversation_id: str
    message_id: str
    text: str = ""
    draft_spans: list[tuple[int, int]] = field(default_factory=list)
    base_text: str = ""  # what a continued message already said
    submitted_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    num_tokens: int = 0
    num_drafted: int = 0
    saved_text: str = ""  # what the store holds of it
    is_stopping: bool = False
    save_failed: bool = False  # the store refused a write of it (reported once)

    @classmethod
    def start(cls, request_id: str, conversation_id: str, message_id: str, base: str, spans):
        return cls(request_id, conversation_id, message_id, text=base, base_text=base,
                   draft_spans=list(spans), saved_text=base)  # fmt: skip

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        return tuple(self.draft_spans)

    def add(self, event: Tokens) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        start = len(self.text)
        self.text += event.text
        drafted = sum(event.from_draft)
        self.num_tokens += len(event.token_ids)
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
