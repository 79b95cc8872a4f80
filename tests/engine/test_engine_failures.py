"""A request whose forward fails half-way is reported, and the conversation's computed state
survives it: the next request reuses it and replies as a fresh engine does."""

from __future__ import annotations

from typing import Any

import pytest

from engine import events as ev
from engine.sequence import truncate
from tests.engine.engine_runner import (
    USERS,
    Runner,
    always_draft,
    assert_same_reply,
    fresh_finished,
    greedy,
    prompt_ids,
    user,
)

SYSTEM = ev.Message("system", "You answer in one short sentence.")


@pytest.mark.parametrize("kind", ["llama", "hybrid"])
def test_a_failed_verify_keeps_the_conversation(
    kind: str, models: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    always_draft(monkeypatch)
    messages = (SYSTEM, user(USERS[0]))
    settings = greedy("lookup", max_tokens=20)
    with Runner() as runner:
        runner.load(models[kind])
        session = runner.engine.session
        assert session is not None
        first = runner.generate(messages, settings)
        model = session.runner.model
        real_mlp = model.layers[-1].mlp
        failed_verifies = 0

        def mlp_failing_in_a_verify(x: Any) -> Any:
            nonlocal failed_verifies
            if session.state.is_recording:  # the regenerate drafts the first reply
                failed_verifies += 1
                raise MemoryError
            return real_mlp(x)

        monkeypatch.setattr(model.layers[-1], "mlp", mlp_failing_in_a_verify)
        step = session.runner.cpu_step  # the C step runs the MLP in C: it fails after its call
        real_run = step._run if step is not None else None

        def run_failing_in_a_verify(*args: Any) -> None:
            nonlocal failed_verifies
            real_run(*args)
            if session.state.is_recording:
                failed_verifies += 1
                raise MemoryError

        if step is not None:
            monkeypatch.setattr(step, "_run", run_failing_in_a_verify)
        events = runner.request(ev.Generate("oom", messages, settings))
        assert isinstance(events[-1], ev.Failed) and "Out of memory" in events[-1].message
        assert failed_verifies == 1
        # undone, the verify still open: the next request rolls it back (Session._recover)
        assert not session.state.is_poisoned and session.state.is_recording
        monkeypatch.setattr(model.layers[-1], "mlp", real_mlp)
        if step is not None:
            monkeypatch.setattr(step, "_run", real_run)

        again = runner.generate(messages, settings)
        assert_same_reply(again, fresh_finished(models[kind], messages, settings))
        assert_same_reply(again, first)
        assert again.stats is not None
        # the prompt's computed rows survived the failure (they used to be thrown away)
        slack = 1 if kind == "llama" else 8  # the hybrid resumes from a message boundary
        assert again.stats.reused_tokens >= len(prompt_ids(messages)) - slack


def test_a_verify_left_open_is_rolled_back_before_the_next_request(
    models: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verify that failed on its first row leaves the state at the checkpoint with the
    recording open; a request resuming right there must not find it still open."""
    always_draft(monkeypatch)
    messages = (user(USERS[0]),)
    settings = greedy("lookup", max_tokens=20)
    with Runner() as runner:
        runner.load(models["llama"])
        session = runner.engine.session
        assert session is not None
        first = runner.generate(messages, settings)
        ids = prompt_ids(messages)
        truncate(session.runner, session.state, len(ids) - 1)  # where a regenerate forks
        session.state.checkpoint(record=True)
        again = runner.generate(messages, settings)  # drafts the first reply: verifies
        assert_same_reply(again, first)
        assert again.stats is not None and again.stats.drafted > 0
        assert again.stats.reused_tokens == len(ids) - 1
