"""The thinking splitter: a reply's <think> block apart from its answer, streamed in
chunks that split tags anywhere, never showing half a tag."""

from __future__ import annotations

import itertools

import pytest

from engine.events import ReplyPart, Tokens
from engine.thinking import ReplyStream, ThinkingSplitter, opens_thinking, split_thinking
from engine.tokenizer import Tokenizer
from tests.tiny_tokenizer import build_hf_tokenizer

CASES = [
    # (reply, opened by the prompt, thinking, answer)
    ("<think>\nLet me add.\n2+2=4\n</think>\n\nIt is 4.", False, "Let me add.\n2+2=4", "It is 4."),
    ("  <think>short</think>Answer", False, "short", "Answer"),
    ("Plain answer, no <think> here.", False, "", "Plain answer, no <think> here."),
    ("<thinking is not a tag", False, "", "<thinking is not a tag"),
    ("<think></think>\n\nEmpty thoughts.", False, "", "Empty thoughts."),
    ("\nWhy? Because.\n</think>\n\nSo.", True, "Why? Because.", "So."),
    ("<think>unclosed thought </thi", False, "unclosed thought </thi", ""),
    (
        "<think>é ünïcode 思考</think> 答え <think>kept</think>",
        False,
        "é ünïcode 思考",
        "答え <think>kept</think>",
    ),
    ("<thi", False, "", "<thi"),
]


def fed(chunks: list[str], opened: bool) -> tuple[str, str, list[tuple[str, str]]]:
    splitter = ThinkingSplitter(opened=opened)
    segments = []
    for chunk in chunks:
        segments += splitter.feed(chunk)
    segments += splitter.flush()
    thinking = "".join(t for part, t in segments if part == ReplyPart.THINKING)
    answer = "".join(t for part, t in segments if part == ReplyPart.ANSWER)
    return thinking, answer, segments


@pytest.mark.parametrize(("reply", "opened", "thinking", "answer"), CASES)
def test_every_split_into_two_and_three_chunks_gives_the_same_parts(
    reply, opened, thinking, answer
):
    assert split_thinking(reply, opened=opened) == (thinking, answer)
    for i, j in itertools.combinations_with_replacement(range(len(reply) + 1), 2):
        got_thinking, got_answer, segments = fed([reply[:i], reply[i:j], reply[j:]], opened)
        assert (got_thinking, got_answer) == (thinking, answer), (i, j)
        # no half tag ever shown: every tag that reaches a part arrived whole in the reply
        shown = "".join(t for _, t in segments)
        assert shown.count("<") == (thinking + answer).count("<")


@pytest.mark.parametrize(("reply", "opened", "thinking", "answer"), CASES)
def test_one_character_at_a_time_never_shows_a_partial_tag(reply, opened, thinking, answer):
    splitter = ThinkingSplitter(opened=opened)
    shown = {ReplyPart.THINKING: "", ReplyPart.ANSWER: ""}
    for ch in reply:
        for part, text in splitter.feed(ch):
            shown[ReplyPart(part)] += text
            # what is on screen so far is a prefix of the final part
            assert {"thinking": thinking, "answer": answer}[part].startswith(shown[part])
    for part, text in splitter.flush():
        shown[ReplyPart(part)] += text
    assert (shown[ReplyPart.THINKING], shown[ReplyPart.ANSWER]) == (thinking, answer)


def test_a_prompt_that_leaves_think_open_is_recognised():
    assert opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_thinking("<|im_start|>assistant\n")


def test_reply_stream_puts_every_token_in_one_event_of_its_part():
    tokenizer = Tokenizer(
        build_hf_tokenizer(), bos_id=None, eos_id=2, add_bos=False, chat_template=None
    )
    reply = "<think>\nsky is blue\n</think>\n\nThe sea is blue."
    ids = tokenizer.encode(reply, add_special=False)
    events: list[Tokens] = []
    stream = ReplyStream("r", tokenizer, events.append)
    for at in range(0, len(ids), 3):  # batches of three, as a speculative step may give
        batch = ids[at : at + 3]
        stream.add(batch, [True] * len(batch))
    stream.finish()
    assert (stream.thinking, stream.answer) == ("sky is blue", "The sea is blue.")
    assert [i for e in events for i in e.token_ids] == ids
    for event in events:
        assert event.part in (ReplyPart.THINKING, ReplyPart.ANSWER)
        if event.token_ids:
            assert "".join(event.pieces) == event.text
    by_part = {p: "".join(e.text for e in events if e.part == p) for p in ReplyPart}
    assert by_part == {ReplyPart.THINKING: "sky is blue", ReplyPart.ANSWER: "The sea is blue."}
    # the block's tokens, tags and the whitespace inside them included
    block = tokenizer.encode("<think>\nsky is blue\n</think>", add_special=False)
    assert ids[: len(block)] == block
    assert stream.num_thinking_tokens == len(block)
    # what the stream says token by token adds up to the same count
    assert sum(len(e.token_ids) for e in events if e.part == ReplyPart.THINKING) == len(block)
