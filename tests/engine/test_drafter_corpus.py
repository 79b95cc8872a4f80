"""The lookup drafter's index (issue 16 point 9): every distinct token sequence is held
once (thirty regenerates of a chat index its prompt once, through the engine), its size
estimate is what Python really holds, and past its byte budget it keeps the newest chats.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from engine import events as ev
from engine.sampling import SamplingSettings
from engine.suffix_drafter import SuffixDrafter
from tests.engine.engine_runner import Runner, prompt_ids, user

LONG_QUESTION = " ".join(
    f"Point {i}: the sea is blue, the sky is wide, and the sand is warm." for i in range(6)
)


def prefixes(tokens: list[int]) -> set[tuple[int, ...]]:
    return {tuple(tokens[:n]) for n in range(1, len(tokens) + 1)}


@pytest.mark.parametrize("drafter", ["lookup", "off"])
def test_thirty_regenerates_index_only_the_distinct_tokens(models: dict, drafter: str) -> None:
    """Each regenerate re-sends the same prompt and samples another reply: the index holds
    the prompt once and each reply's tokens (before: the prompt again every time)."""
    messages = (user(LONG_QUESTION),)
    prompt = prompt_ids(messages)
    assert 200 <= len(prompt) <= 400
    with Runner() as runner:
        runner.load(models["llama"])
        replies = []
        for seed in range(30):
            sampling = SamplingSettings(temperature=1.0, seed=seed)
            settings = ev.GenerationSettings(sampling, max_tokens=12, drafter=drafter)
            replies.append(list(runner.generate(messages, settings).token_ids))
        lookup = runner.engine.session.lookup
        held = set().union(*(prefixes(prompt + reply) for reply in replies))
        # the last token of a reply cut at max_tokens is never forwarded, so never indexed
        forwarded = set().union(*(prefixes(prompt + reply[:-1]) for reply in replies))
        assert len(forwarded) <= lookup.num_tokens <= len(held)
        assert len(held) > len(prompt) + 2 * 12  # the replies did differ
        assert lookup.num_states <= 2 * len(held)


def zipf_text(rng: np.random.Generator, n: int) -> list[int]:
    """Token ids with a chat-like frequency profile."""
    return [int(t) % 49152 for t in rng.zipf(1.3, n)]


def test_nbytes_is_what_the_index_holds() -> None:
    """The estimate against the bytes Python allocated for the index, within 20%."""
    rng = np.random.default_rng(4)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        drafter = SuffixDrafter(max_bytes=None)
        context: list[int] = []
        for _ in range(20):
            context += zipf_text(rng, 300)
            drafter.begin(context)
            reply = zipf_text(rng, 200)
            drafter.commit(reply)
            drafter.end()
            context += reply
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert drafter.num_tokens == len(context)
    assert 0.8 <= drafter.nbytes() / held <= 1.25, (drafter.nbytes(), held)


def chats(num: int, length: int = 500) -> list[list[int]]:
    """Chats whose tokens never overlap (chat i uses ids i*1000 .. i*1000+999)."""
    rng = np.random.default_rng(9)
    return [[int(t) for t in rng.integers(i * 1000, i * 1000 + 1000, length)] for i in range(num)]


def feed(drafter: SuffixDrafter, chat: list[int]) -> None:
    """A request: the chat's first 400 tokens as the prompt, the rest as the reply."""
    drafter.begin(chat[:400])
    drafter.commit(chat[400:])
    drafter.end()


def proposes(drafter: SuffixDrafter, chat: list[int]) -> bool:
    """Whether a request repeating the chat's start is offered the rest of it."""
    drafter.begin(chat[:100])
    proposal = drafter.propose(chat[100], 8).tokens
    drafter.end()
    return proposal == chat[101:109]


def test_past_its_budget_the_index_keeps_the_newest_chats() -> None:
    all_chats = chats(20)
    unbounded = SuffixDrafter(max_bytes=None)
    for chat in all_chats:
        feed(unbounded, chat)
    budget = unbounded.nbytes() // 4
    drafter = SuffixDrafter(max_bytes=budget)
    for chat in all_chats:
        feed(drafter, chat)
        assert drafter.nbytes() <= budget
    assert drafter.num_rebuilds >= 2
    assert proposes(drafter, all_chats[-1])
    assert not proposes(drafter, all_chats[0])
    assert drafter.num_tokens <= unbounded.num_tokens // 4


def test_a_lower_budget_applies_between_requests() -> None:
    drafter = SuffixDrafter(max_bytes=None)
    all_chats = chats(8)
    for chat in all_chats:
        feed(drafter, chat)
    full = drafter.nbytes()
    drafter.begin(all_chats[-1][:100])  # a request is running: its path stays
    drafter.set_budget(full // 3)
    assert drafter.num_rebuilds == 0
    assert drafter.propose(all_chats[-1][100], 8).tokens == all_chats[-1][101:109]
    drafter.end()
    assert drafter.num_rebuilds == 1
    assert drafter.nbytes() <= full // 3
    assert proposes(drafter, all_chats[-1])
    drafter.set_budget(None)  # unbounded again: nothing more is dropped
    feed(drafter, all_chats[0])
    assert drafter.num_rebuilds == 1


def test_a_chat_larger_than_the_budget_keeps_its_last_tokens() -> None:
    chat = chats(1, length=2000)[0]
    drafter = SuffixDrafter(max_bytes=None)
    feed(drafter, chat)
    drafter.set_budget(drafter.nbytes() // 10)
    assert 0 < drafter.num_tokens <= 2000 // 10 // 2 + 1
    assert drafter.path(0) == []
    tail = chat[-drafter.num_tokens :]
    drafter.begin(tail[:20])
    assert drafter.propose(tail[20], 8).tokens == tail[21:29]
