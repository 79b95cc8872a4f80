"""Walking between two sibling branches (issue 16, point 6): each distinct tail is stored
once, so A/B round trips keep one tail per branch and the branch cache's bytes stay
constant (before, every switch stored the branch being left again: 13 tails after four
round trips, bytes growing linearly and evicting other siblings under the budget)."""

from __future__ import annotations

import pytest

from engine import events as ev
from tests.engine.engine_runner import (
    USERS,
    Runner,
    assert_same_reply,
    assistant,
    fresh_finished,
    greedy,
    user,
)


@pytest.mark.parametrize("kind", ["llama", "hybrid"])
def test_round_trips_keep_one_tail_per_branch_and_constant_bytes(kind: str, models: dict) -> None:
    head = (ev.Message("system", "You answer in one short sentence."),)
    settings = greedy(max_tokens=12)
    with Runner() as runner:
        runner.load(models[kind])
        branch_a: tuple[ev.Message, ...] = head
        for text in USERS[:2]:
            branch_a += (user(text),)
            branch_a += (assistant(runner.generate(branch_a, settings).text),)
        branch_a += (user(USERS[2]),)
        branch_b = (*branch_a[:3], user("What about the mountains?"))
        session = runner.engine.session
        assert session is not None
        want = {
            "a": fresh_finished(models[kind], branch_a, settings),
            "b": fresh_finished(models[kind], branch_b, settings),
        }
        trips = [("a", branch_a), ("b", branch_b)] * 5
        sizes, held = [], []
        for i, (name, branch) in enumerate(trips):
            assert_same_reply(runner.generate(branch, settings), want[name])
            if i % 2 and i > 1:  # after each of the 4 round trips once both are cached
                sizes.append((len(session.branches.tails), session.branches.nbytes()))
                held.append({tuple(t.tokens) for t in session.branches.tails.values()})
        assert sizes == [sizes[0]] * 4, sizes
        assert held == [held[0]] * 4
        tails = list(session.branches.tails.values())
        ends = [session.state.tokens[: t.fork] + t.tokens for t in tails]
        # one tail each for A (left for B) and B (left for A), besides the earlier turns';
        # a state holds its reply but the pending last token
        for finished in want.values():
            reply_ids = list(finished.token_ids[:-1])
            assert sum(e[-len(reply_ids) :] == reply_ids for e in ends) == 1
