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


def test_a_continued_replys_figures_cover_both_parts():
    from app.conversation.streaming_reply import combine_stats

    first = dict(generated_tokens=10, decode_tok_s=20.0, ttft_s=0.3, drafted=8, accepted=4,
                 reused_tokens=0, prefilled_tokens=50, context_tokens=60)  # fmt: skip
    second = dict(generated_tokens=30, decode_tok_s=10.0, ttft_s=0.1, drafted=20, accepted=5,
                  reused_tokens=60, prefilled_tokens=2, context_tokens=92)  # fmt: skip
    both = combine_stats(first, second)
    assert (both["generated_tokens"], both["drafted"], both["accepted"]) == (40, 28, 9)
    assert both["decode_tok_s"] == 40 / (10 / 20.0 + 30 / 10.0)  # tokens over decode time
    assert both["ttft_s"] == 0.3 and both["parts"] == 2  # the reply's first token
    assert (both["reused_tokens"], both["prefilled_tokens"], both["context_tokens"]) == (60, 52, 92)
    assert combine_stats(both, second)["parts"] == 3
