"""One byte budget over the live state, snapshots, branch cache and lookup index
(engine/memory.py): each part's bytes reported in Stats, evicted in the stated order
(branch tails, then snapshots, then the lookup index; never the live state) and never a
change in the replies: every reply here equals a fresh engine's."""

from __future__ import annotations

import time

import pytest

from engine import events as ev
from engine.config import EngineConfig
from engine.memory import MIN_DEFAULT_BUDGET_BYTES, default_budget_bytes, physical_memory_bytes
from engine.suffix_drafter import SuffixDrafter
from tests.engine.engine_runner import (
    USERS,
    Runner,
    assert_same_reply,
    assistant,
    fresh_finished,
    greedy,
    user,
)

SETTINGS = greedy("lookup", max_tokens=16)


def test_the_default_is_a_quarter_of_physical_memory() -> None:
    physical = physical_memory_bytes()
    assert physical is not None and physical > 0  # Linux and macOS say
    assert default_budget_bytes() == physical // 4
    assert default_budget_bytes(16 << 30) == 4 << 30
    assert default_budget_bytes(1 << 20) == MIN_DEFAULT_BUDGET_BYTES
    assert EngineConfig.from_environment(
        {"BRANCHCHAT_MEMORY_BUDGET": "3G"}
    ).memory_budget_bytes == (3 << 30)
    with pytest.raises(ValueError, match="BRANCHCHAT_MEMORY_BUDGET"):
        EngineConfig.from_environment({"BRANCHCHAT_MEMORY_BUDGET": "lots"})
    with pytest.raises(ValueError, match="memory budget"):
        ev.SetMemoryBudget(-1)


def converse(runner: Runner, path: object) -> list[ev.Finished]:
    """Three turns, an edit of the second (its sibling goes to the branch cache) and a
    switch back; each reply checked against a fresh engine."""
    replies = []
    branch: tuple[ev.Message, ...] = ()
    for text in USERS:
        branch += (user(text),)
        replies.append(runner.generate(branch, SETTINGS))
        branch += (assistant(replies[-1].text),)
    edited = (*branch[:2], user("What about the mountains?"))
    replies.append(runner.generate(edited, SETTINGS))
    back = (*branch, user("And at night?"))
    replies.append(runner.generate(back, SETTINGS))
    for messages, reply in ((edited, replies[-2]), (back, replies[-1])):
        assert_same_reply(reply, fresh_finished(path, messages, SETTINGS))  # type: ignore[arg-type]
    return replies


def test_stats_report_the_bytes_of_each_part(models: dict) -> None:
    budget = 64 << 20
    with Runner(memory_budget_bytes=budget) as runner:
        runner.load(models["hybrid"])
        stats = converse(runner, models["hybrid"])[-1].stats
        session = runner.engine.session
        assert stats is not None and session is not None
        state = session.state
        kv = sum(layer.nbytes() for layer in state.layers)
        assert stats.kv_bytes == kv > 0
        assert stats.snapshot_bytes == state.nbytes() - kv > 0  # a hybrid keeps snapshots
        assert stats.branch_cache_bytes == session.branches.nbytes() > 0
        assert stats.drafter_bytes == session.lookup.nbytes() > 0
        parts = stats.kv_bytes + stats.snapshot_bytes + stats.branch_cache_bytes
        # a tail's snapshots may be the live state's own arrays: counted once in the total
        assert parts - stats.branch_cache_bytes < stats.memory_bytes - stats.drafter_bytes <= parts
        assert stats.memory_budget_bytes == budget


def held(runner: Runner) -> tuple[int, int, int]:
    session = runner.engine.session
    assert session is not None
    use = session.enforce_memory()
    return use.branch_cache, use.snapshots, use.drafter


def wait_for(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the engine did not apply the budget"
        time.sleep(0.01)


def test_eviction_goes_tails_then_snapshots_then_the_lookup_index(models: dict) -> None:
    with Runner() as runner:  # the default budget: everything fits
        runner.load(models["hybrid"])
        converse(runner, models["hybrid"])
        session = runner.engine.session
        assert session is not None
        tails, snapshots, corpus = held(runner)
        assert tails > 0 and snapshots > 0 and corpus > 0
        kv = sum(layer.nbytes() for layer in session.state.layers)

        # room for everything but the tails: the branch cache goes first, whole
        runner.engine.submit(ev.SetMemoryBudget(kv + snapshots + corpus))
        wait_for(lambda: session.branches.nbytes() == 0)
        assert held(runner)[1:] == (snapshots, corpus)

        # less: snapshots go next, lowest position first; the lookup index stays whole
        positions = session.state.snapshot_positions()
        runner.engine.submit(ev.SetMemoryBudget(kv + snapshots // 2 + corpus))
        wait_for(lambda: session.state.snapshot_positions() != positions)
        kept = session.state.snapshot_positions()
        assert kept and kept == positions[-len(kept) :]
        assert held(runner)[2] == corpus

        # no room past the live state: all but the live state goes, and it answers alike
        runner.engine.submit(ev.SetMemoryBudget(0))
        wait_for(lambda: session.lookup.nbytes() < corpus)
        assert session.state.snapshot_positions() == [] and session.branches.nbytes() == 0
        assert sum(layer.nbytes() for layer in session.state.layers) == kv  # never evicted
        messages = (user(USERS[0]),)
        reply = runner.generate(messages, SETTINGS)
        assert_same_reply(reply, fresh_finished(models["hybrid"], messages, SETTINGS))
        assert reply.stats is not None
        assert reply.stats.memory_bytes > reply.stats.memory_budget_bytes == 0


@pytest.mark.parametrize("kind", ["llama", "hybrid"])
def test_every_request_ends_within_the_budget(kind: str, models: dict) -> None:
    with Runner() as runner:
        runner.load(models[kind])
        session = runner.engine.session
        assert session is not None
        kv = sum(layer.nbytes() for layer in session.state.layers)
    budget = 4 * kv + (256 << 10)  # more than the live state, less than everything
    with Runner(memory_budget_bytes=budget) as runner:
        runner.load(models[kind])
        for reply in converse(runner, models[kind]):
            assert reply.stats is not None
            # the live state is never evicted, nor an empty index's few hundred bytes
            floor = reply.stats.kv_bytes + SuffixDrafter().nbytes()
            assert reply.stats.memory_bytes <= max(budget, floor)
