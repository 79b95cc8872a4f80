"""Scripted conversations with edits at several depths: every reply equals a fresh engine's
and the reused / prefilled counts are exactly what the rendered prompts allow.

Expected reuse is computed without the engine: render with the chat template, tokenize,
take the common token prefix with what the state held. A full-attention model reuses
exactly that prefix; a hybrid model can only go back to a snapshot, and the engine takes
one at every message boundary, so an edit of message i reuses exactly the tokens of
messages[:i].
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import events as ev
from engine.branch_cache import common_prefix
from engine.chat_template import render_chat
from engine.default_model import default_model_path, is_default_model_present
from tests.engine.engine_runner import (
    USERS,
    Runner,
    always_draft,
    assert_same_reply,
    assistant,
    fresh_finished,
    greedy,
    prompt_ids,
    user,
)

SYSTEM = ev.Message("system", "You answer in one short sentence.")
EDITS = ("Hi! Who made you?", "What about the mountains?", "How come it looks blue?")


class Chat:
    """One engine holding a conversation; each request is checked against a fresh engine."""

    def __init__(self, runner: Runner, path: Path, kind: str, backend: str, drafter: str):
        self.runner, self.path, self.kind, self.backend = runner, path, kind, backend
        self.settings = greedy(drafter, max_tokens=20)
        self.num_drafted = self.num_accepted = 0

    def send(
        self,
        messages: tuple[ev.Message, ...],
        snapshot_at: int | None = None,
        cached: list[int] | None = None,
    ) -> ev.Finished:
        """Run messages and check the reply and its reuse counts.

        Reuse reaches the common prefix with the live state, or with `cached` (a sibling
        branch's tokens the branch cache holds); a hybrid model must reuse exactly
        `snapshot_at` tokens when given.
        """
        ids = prompt_ids(messages)
        held = max(self.runner.state_tokens(), cached or [], key=lambda t: common_prefix(t, ids))
        reply = self.runner.generate(messages, self.settings)
        stats = reply.stats
        assert stats is not None
        reachable = min(common_prefix(held, ids), len(ids) - 1)  # the last token is forwarded
        assert stats.prompt_tokens == len(ids)
        assert stats.reused_tokens + stats.prefilled_tokens == len(ids)
        if self.kind == "llama":
            assert stats.reused_tokens == reachable
        elif snapshot_at is not None:
            assert snapshot_at <= reachable
            assert stats.reused_tokens == snapshot_at
        else:
            assert stats.reused_tokens <= reachable
        assert self.runner.state_tokens()[: len(ids)] == ids
        self.num_drafted += stats.drafted
        self.num_accepted += stats.accepted
        want = fresh_finished(self.path, messages, self.settings, self.backend)
        assert_same_reply(reply, want)
        return reply


def message_start(messages: tuple[ev.Message, ...]) -> int:
    """Tokens of `messages` as a finished prefix: where the next message starts."""
    return len(prompt_ids(messages, add_generation_prompt=False)) if messages else 0


CASES = [
    ("llama", "numpy", "off"),
    ("llama", "numpy", "lookup"),
    ("hybrid", "numpy", "off"),
    ("hybrid", "numpy", "lookup"),
    ("llama", "mlx", "lookup"),
]


@pytest.mark.parametrize(("kind", "backend", "drafter"), CASES, ids=["-".join(c) for c in CASES])
def test_edits_at_every_depth_match_a_fresh_engine(
    kind: str, backend: str, drafter: str, models: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    always_draft(monkeypatch)
    # the hybrid starts with a system message, so an edit of the first user message
    # has a message boundary (a snapshot) before it
    head: tuple[ev.Message, ...] = (SYSTEM,) if kind == "hybrid" else ()
    with Runner(backend) as runner:
        runner.load(models[kind])
        chat = Chat(runner, models[kind], kind, backend, drafter)
        messages = head
        for text in USERS:  # three turns, each a follow-up on the same branch
            # a hybrid resumes at least from the snapshot at the end of the last user message
            previous_user = message_start(messages[:-1]) if len(messages) > len(head) else 0
            messages += (user(text),)
            reply = chat.send(messages)
            if kind == "hybrid":
                assert reply.stats is not None and reply.stats.reused_tokens >= previous_user
            messages += (assistant(reply.text),)

        # edit the last, the middle, then the first user message, each regenerated once
        user_indices = [i for i, m in enumerate(messages) if m.role == "user"]
        previous = messages[: user_indices[-1] + 1]  # the last request's branch
        for index, text in zip(reversed(user_indices), EDITS[::-1], strict=True):
            branch = (*messages[:index], user(text))
            start = message_start(messages[:index])
            common = common_prefix(prompt_ids(previous), prompt_ids(branch))
            # past the unchanged messages, the edited one's header at most (before the first
            # message the template's default system prompt is shared as well)
            assert start <= common < start + (8 if start else 80)
            edited = chat.send(branch, snapshot_at=start)
            assert edited.stats is not None
            assert edited.stats.reused_tokens == (common if kind == "llama" else start)
            previous = branch
            # a regenerate: everything but the last prompt token is reused; a hybrid goes
            # back to the snapshot at the end of the user message
            regenerated = chat.send(branch, snapshot_at=message_start(branch))
            assert regenerated.stats is not None
            if kind == "llama":
                assert regenerated.stats.prefilled_tokens == 1
    if drafter == "lookup":  # regenerates draft the previous reply; other drafts miss
        assert chat.num_drafted > chat.num_accepted > 0


@pytest.mark.parametrize("kind", ["llama", "hybrid"])
def test_switching_back_to_a_sibling_branch_reuses_its_cached_tail(kind: str, models: dict) -> None:
    head: tuple[ev.Message, ...] = (SYSTEM,) if kind == "hybrid" else ()
    with Runner() as runner:
        runner.load(models[kind])
        chat = Chat(runner, models[kind], kind, "numpy", "off")
        branch_a = head
        for text in USERS:
            branch_a += (user(text),)
            branch_a += (assistant(chat.send(branch_a).text),)
        held_a = runner.state_tokens()

        middle = len(head) + 2  # the second user message
        branch_b = (*branch_a[:middle], user(EDITS[1]))
        fork = common_prefix(held_a, prompt_ids(branch_b))
        chat.send(branch_b, snapshot_at=message_start(branch_a[:middle]))
        assert len(runner.state_tokens()) < len(held_a)

        # back to A with one more user message: the branch cache brings back A's tail
        again = (*branch_a, user("And at night?"))
        ids = prompt_ids(again)
        assert common_prefix(runner.state_tokens(), ids) == fork
        reply = chat.send(again, cached=held_a)
        assert reply.stats is not None
        reused = reply.stats.reused_tokens
        assert reused > fork
        if kind == "hybrid":  # from a snapshot the tail kept: at least the last user message
            assert reused >= message_start(branch_a[:-1])


def test_switching_back_under_a_tight_cache_budget(models: dict) -> None:
    """Leaving the current branch to restore a cached one must not evict the one restored."""
    with Runner() as runner:
        runner.load(models["llama"])
        chat = Chat(runner, models["llama"], "llama", "numpy", "off")
        branch_a: tuple[ev.Message, ...] = ()
        for text in USERS:
            branch_a += (user(text),)
            branch_a += (assistant(chat.send(branch_a).text),)
        held_a = runner.state_tokens()
        chat.send((*branch_a[:2], user(EDITS[1])))
        session = runner.engine.session
        assert session is not None
        largest = max(tail.nbytes for tail in session.branches.tails.values())
        # the one memory budget: what the rest of the state holds, plus room for A's tail
        rest = session.enforce_memory()
        runner.engine.submit(ev.SetMemoryBudget(rest.total - rest.branch_cache + largest))
        again = (*branch_a, user("And at night?"))
        reply = chat.send(again, cached=held_a)
        assert reply.stats is not None
        assert reply.stats.reused_tokens == common_prefix(held_a, prompt_ids(again))
        assert session.branches.nbytes() <= largest


@pytest.mark.real_model
@pytest.mark.skipif(not is_default_model_present(), reason="the default model is not fetched")
def test_real_model_edit_of_the_last_turn_reuses_the_unchanged_prefix() -> None:
    path = default_model_path()
    settings = greedy(max_tokens=10)
    questions = ("What is the capital of France?", "And of Italy?", "Which one is bigger?")
    with Runner("numpy") as runner:
        runner.load(path)
        assert runner.engine.session is not None
        tokenizer = runner.engine.session.tokenizer
        template = tokenizer.chat_template
        assert template is not None

        def real_ids(messages: tuple[ev.Message, ...], add_generation_prompt: bool = True) -> list:
            dicts = [{"role": m.role, "content": m.content} for m in messages]
            return tokenizer.encode(
                render_chat(template, dicts, add_generation_prompt=add_generation_prompt)
            )

        messages: tuple[ev.Message, ...] = ()
        for text in questions:
            messages += (user(text),)
            messages += (assistant(runner.generate(messages, settings).text),)
        edited = (*messages[:4], user("Which one is older?"))
        old_ids, new_ids = real_ids(messages[:5]), real_ids(edited)
        assert runner.state_tokens()[: len(old_ids)] == old_ids
        reply = runner.generate(edited, settings)
    unchanged = len(real_ids(messages[:4], add_generation_prompt=False))
    assert old_ids[:unchanged] == new_ids[:unchanged]
    reused = common_prefix(old_ids, new_ids)
    assert unchanged <= reused < len(new_ids)
    assert reply.stats is not None
    assert (reply.stats.reused_tokens, reply.stats.prefilled_tokens) == (
        reused,
        len(new_ids) - reused,
    )
    assert_same_reply(reply, fresh_finished(path, edited, settings))
