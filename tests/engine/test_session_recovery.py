"""After a forward that fails half-way (issue 16 point 4, the session's side), the
conversation's state is kept where the state could undo the forward exactly: the next
request reuses it and replies as a fresh engine does. Only a state that says it could
not be restored (a partly written sliding ring) is recomputed from the start."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from engine import events as ev
from engine.branch_cache import common_prefix
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

MESSAGES = (user(" ".join(USERS)),)


def fail_once(loaded: Any, when: Any) -> None:
    """The model's output head raises MemoryError once, on the first call `when` accepts
    (x: the rows [L, D]): every layer has already written its rows, as an allocation failing
    late would; where the C step serves the call (engine/runner/cpu_step.py), after it."""
    model, step = loaded.model, loaded.runner.cpu_step
    real, real_run = model.logits, step._run if step is not None else None

    def restore() -> None:
        model.logits = real
        if step is not None:
            step._run = real_run

    def logits(x: Any) -> Any:
        if when(x):
            restore()
            raise MemoryError
        return real(x)

    def run(plan: Any, x: Any, *rest: Any) -> None:
        real_run(plan, x, *rest)
        if when(x):
            restore()
            raise MemoryError

    model.logits = logits
    if step is not None:
        step._run = run


@pytest.mark.parametrize("kind", ["llama", "hybrid"])
@pytest.mark.parametrize("where", ["verify", "prefill"])
def test_a_failed_forward_keeps_the_conversation(
    kind: str, where: str, models: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    always_draft(monkeypatch)
    settings = greedy("lookup", max_tokens=16)
    with Runner() as runner:
        runner.load(models[kind])
        first = runner.generate(MESSAGES, settings)
        session = runner.engine.session
        assert session is not None
        held = runner.state_tokens()
        snapshots = session.state.snapshot_positions()
        if where == "verify":  # a regenerate drafts the reply before: it fails in a verify
            fail_once(session.loaded, lambda x: x.shape[0] > 1)
            messages = MESSAGES
        else:  # a follow-up fails in its prefill
            fail_once(session.loaded, lambda x: True)
            messages = (*MESSAGES, ev.Message("assistant", first.text), user("And then?"))
        failed = runner.request(ev.Generate("fails", messages, settings))[-1]
        assert isinstance(failed, ev.Failed) and "Out of memory" in failed.message
        assert not session.state.is_poisoned
        again = runner.generate(messages, settings)
        assert again.stats is not None
        ids = prompt_ids(messages)
        # nothing was thrown away: the state reaches as far into the prompt as before the
        # failed request (a hybrid: to the snapshot nearest before the common prefix)
        common = min(len(held), common_prefix(held, ids), len(ids) - 1)
        if kind == "hybrid":
            common = max(p for p in snapshots if p <= common)
        assert again.stats.reused_tokens + again.stats.replayed_tokens >= common > 0
        assert_same_reply(again, fresh_finished(models[kind], messages, settings))


@pytest.mark.parametrize("kind", ["llama", "hybrid"])
def test_continue_after_a_failed_verify(
    kind: str, models: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failed verify left its recording open; a Continue extends the state without a
    rewind, so it must not find the recording still open (it failed with "a recorded
    checkpoint is still open")."""
    always_draft(monkeypatch)
    settings = greedy("lookup", max_tokens=16)
    with Runner() as runner:
        runner.load(models[kind])
        runner.generate(MESSAGES, settings)
        session = runner.engine.session
        assert session is not None
        fail_once(session.loaded, lambda x: x.shape[0] > 1)
        events = runner.request(ev.Generate("fails", MESSAGES, settings))
        assert isinstance(events[-1], ev.Failed)
        partial = "".join(e.text for e in events if isinstance(e, ev.Tokens))
        messages = (*MESSAGES, ev.Message("assistant", partial))
        resumed = runner.generate(messages, dataclasses.replace(settings, continue_last=True))
        assert resumed.stats is not None and resumed.stats.reused_tokens > 0
        want = fresh_finished(
            models[kind], messages, dataclasses.replace(settings, continue_last=True)
        )
        assert_same_reply(resumed, want)
