"""Drafted spans of a streamed reply follow each token's own text."""

from __future__ import annotations

from app.conversation.streaming_reply import StreamingReply
from engine.events import Tokens


def test_drafted_spans_follow_each_tokens_text() -> None:
    reply = StreamingReply.start("r", "c", "m", "", ())
    reply.add(Tokens("r", "Hello world", (1, 2, 3), (True, False, True), ("Hel", "lo", " world")))
    reply.add(Tokens("r", "!!", (4, 5), (True, True), ("!", "!")))
    assert reply.text == "Hello world!!"
    assert reply.spans == ((0, 3), (5, 13))  # the last drafted run joins the next event's
    assert (reply.num_tokens, reply.num_drafted) == (5, 4)


def test_a_character_split_over_two_tokens_is_tinted_by_the_token_that_completes_it() -> None:
    reply = StreamingReply.start("r", "c", "m", "Base. ", ())
    reply.add(Tokens("r", "é", (7, 8), (True, False), ("", "é")))
    assert reply.spans == ()
    reply.add(Tokens("r", "é", (7, 8), (False, True), ("", "é")))
    assert reply.spans == ((7, 8),)


def test_events_without_pieces_split_the_drafted_share_by_count() -> None:
    reply = StreamingReply.start("r", "c", "m", "", ())
    reply.add(Tokens("r", "abcdef", (1, 2, 3), (True, True, False)))
    assert reply.spans == ((0, 4),)
