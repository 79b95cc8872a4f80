"""A reasoning model's reply in two parts: the `<think>...</think>` block it opens with,
and the answer after it.

Reasoning models (Qwen3, DeepSeek-R1, QwQ) write their chain of thought first, between
`<think>` and `</think>`, then the answer. Their templates either leave the model to
open the block itself or open it in the generation prompt (Qwen3-Thinking-2507,
DeepSeek-R1); `ThinkingSplitter(opened=True)` covers the second case. Only a block at the
very start of the reply counts: a `<think>` later in an answer is text the model meant to
show (a code sample, an explanation of the tags), as in llama.cpp's reasoning parser.

Tokens split tags anywhere (`</th` + `ink>`), so the splitter holds back any text that
may still turn out to be part of a tag and never shows half a tag. The whitespace a
model puts around its thoughts ("<think>\n", "\n</think>\n\n") belongs to neither part.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from engine import events as ev
from engine.events import ReplyPart
from engine.tokenizer import StreamingDetokenizer, Tokenizer

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

Segment = tuple[str, str]  # (a ReplyPart, text)


class _Stage(StrEnum):
    START = "start"  # nothing but whitespace yet: a <think> may still open
    THINKING = "thinking"
    AFTER = "after"  # the block closed: whitespace before the answer is dropped
    ANSWER = "answer"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ThinkingSplitter:
    """Streaming text in, (part, text) segments out; joined per part they equal
    `split_thinking` of the whole text."""

    def __init__(self, *, opened: bool = False) -> None:
        self._stage = _Stage.THINKING if opened else _Stage.START
        self._held = ""  # text not attributed yet: a possible tag, or edge whitespace
        self._thought = False  # some thinking text was given out (leading space is dropped)
        self.num_consumed = 0  # characters fed so far
        # where the block starts and ends in the characters fed (end: None while open)
        self.block_start: int | None = 0 if opened else None
        self.block_end: int | None = None

    @property
    def part(self) -> str:
        """The part the next text goes to as far as is known now: a reply that so far is
        the start of `<think>` is taken to be thinking (what it nearly always is)."""
        if self._stage == _Stage.THINKING or (self._stage == _Stage.START and self._held.strip()):
            return ReplyPart.THINKING
        return ReplyPart.ANSWER

    def feed(self, text: str) -> list[Segment]:
        start = self.num_consumed - len(self._held)  # where the held text began
        self.num_consumed += len(text)
        buf, self._held = self._held + text, ""
        out: list[Segment] = []
        while buf:
            if self._stage == _Stage.START:
                body = buf.lstrip()
                if body.startswith(THINK_OPEN):
                    self.block_start = start + len(buf) - len(body)
                    cut = len(buf) - len(body) + len(THINK_OPEN)
                    start, buf = start + cut, buf[cut:]
                    self._stage = _Stage.THINKING
                elif not body or THINK_OPEN.startswith(body):
                    self._held = buf  # still undecided
                    return out
                else:
                    self._stage = _Stage.ANSWER
            elif self._stage == _Stage.THINKING:
                at = buf.find(THINK_CLOSE)
                if at < 0:
                    keep = _partial_suffix(buf, THINK_CLOSE)
                    body, tail = buf[: len(buf) - keep], buf[len(buf) - keep :]
                    trimmed = body.rstrip()
                    self._held = body[len(trimmed) :] + tail
                    self._think(trimmed, out)
                    return out
                self._think(buf[:at].rstrip(), out)
                cut = at + len(THINK_CLOSE)
                self.block_end = start + cut
                start, buf = start + cut, buf[cut:]
                self._stage = _Stage.AFTER
            elif self._stage == _Stage.AFTER:
                body = buf.lstrip()
                start, buf = start + len(buf) - len(body), body
                if buf:
                    self._stage = _Stage.ANSWER
            else:
                out.append((ReplyPart.ANSWER, buf))
                return out
        return out

    def flush(self) -> list[Segment]:
        """The reply ended: what was held back goes out (an unclosed block stays thinking)."""
        held, self._held = self._held, ""
        if self._stage == _Stage.THINKING:
            out: list[Segment] = []
            self._think(held.rstrip(), out)
            return out
        if self._stage == _Stage.START and held:
            self._stage = _Stage.ANSWER
            return [(ReplyPart.ANSWER, held)]
        return []

    def is_thinking_at(self, position: int) -> bool:
        """Whether the character at `position` of the fed text is in the block (tags too)."""
        if self.block_start is None or position < self.block_start:
            return False
        return self.block_end is None or position < self.block_end

    def _think(self, text: str, out: list[Segment]) -> None:
        if not self._thought:
            text = text.lstrip()
        if text:
            self._thought = True
            out.append((ReplyPart.THINKING, text))


def split_thinking(text: str, *, opened: bool = False) -> tuple[str, str]:
    """(thinking, answer) of a whole reply."""
    splitter = ThinkingSplitter(opened=opened)
    parts = {ReplyPart.THINKING: "", ReplyPart.ANSWER: ""}
    for part, piece in splitter.feed(text) + splitter.flush():
        parts[ReplyPart(part)] += piece
    return parts[ReplyPart.THINKING], parts[ReplyPart.ANSWER]


def opens_thinking(prompt_text: str) -> bool:
    """Whether a rendered prompt leaves the reply inside an open `<think>` block."""
    last_open = prompt_text.rfind(THINK_OPEN)
    return last_open >= 0 and prompt_text.find(THINK_CLOSE, last_open) < 0


class ReplyStream:
    """A reply's token ids -> `Tokens` events, each for one part, and the two texts.

    Every token id lands in exactly one event, with the text it showed in that part as
    its piece (so an event's pieces join to its text): a token that ends the block and
    starts the answer goes to the answer, its thinking text in an event without ids.
    """

    def __init__(
        self, request_id: str, tokenizer: Tokenizer, emit: Callable[[ev.Event], None], *,
        detect: bool = True, opened: bool = False,
    ) -> None:  # fmt: skip
        self.request_id = request_id
        self._emit = emit
        self._detok = StreamingDetokenizer(tokenizer)
        # detect=False (a continued message): everything is answer
        self._splitter = ThinkingSplitter(opened=opened) if detect else None
        self._texts = {ReplyPart.THINKING: [""], ReplyPart.ANSWER: [""]}
        self._starts: list[int] = []  # each token's first character in the fed text

    @property
    def answer(self) -> str:
        return "".join(self._texts[ReplyPart.ANSWER])

    @property
    def thinking(self) -> str:
        return "".join(self._texts[ReplyPart.THINKING])

    @property
    def num_thinking_tokens(self) -> int:
        """Tokens in the block, its tags included (what the model spent thinking)."""
        if self._splitter is None:
            return 0
        return sum(self._splitter.is_thinking_at(at) for at in self._starts)

    def add(self, token_ids: list[int], from_draft: list[bool]) -> None:
        # items: (part, text, token id or None, drafted)
        items: list[tuple[str, str, int | None, bool]] = []
        for token_id, drafted in zip(token_ids, from_draft, strict=True):
            piece = self._detok.add(token_id)
            start = self._position()
            self._starts.append(start)
            segments = self._split(piece)
            if not segments:  # a tag, edge space or a tag's start: counted where it lies
                segments = [(self._part_at(start), "")]
            for part, text in segments[:-1]:
                items.append((part, text, None, False))
            items.append((segments[-1][0], segments[-1][1], token_id, drafted))
        self._send(items)

    def finish(self) -> None:
        """The reply ended: the detokenizer's and the splitter's held text goes out."""
        segments = self._split(self._detok.flush())
        if self._splitter is not None:
            segments += self._splitter.flush()
        self._send([(part, text, None, False) for part, text in segments if text])

    def _position(self) -> int:
        return self._splitter.num_consumed if self._splitter is not None else 0

    def _part_at(self, position: int) -> str:
        if self._splitter is None:
            return ReplyPart.ANSWER
        if self._splitter.is_thinking_at(position):
            return ReplyPart.THINKING
        return self._splitter.part

    def _split(self, text: str) -> list[Segment]:
        if self._splitter is None:
            return [(ReplyPart.ANSWER, text)] if text else []
        return self._splitter.feed(text)

    def _send(self, items: list[tuple[str, str, int | None, bool]]) -> None:
        """One event for each run of items of the same part."""
        run: list[tuple[str, str, int | None, bool]] = []
        for item in items + [("", "", None, False)]:  # a sentinel ends the last run
            if run and item[0] != run[0][0]:
                self._send_run(run)
                run = []
            run.append(item)

    def _send_run(self, run: list[tuple[str, str, int | None, bool]]) -> None:
        part = run[0][0]
        text = "".join(item[1] for item in run)
        ids = tuple(item[2] for item in run if item[2] is not None)
        drafted = tuple(item[3] for item in run if item[2] is not None)
        pieces: list[str] = []
        pending = ""  # text before a token that no token carries: joins the next one's piece
        for _, piece, token_id, _ in run:
            pending += piece
            if token_id is not None:
                pieces.append(pending)
                pending = ""
        if pieces and pending:
            pieces[-1] += pending
        if not text and not ids:
            return
        self._texts[ReplyPart(part)].append(text)
        plain = ReplyPart(part).value  # events carry plain str, not the enum member
        self._emit(ev.Tokens(self.request_id, text, ids, drafted, tuple(pieces), part=plain))
