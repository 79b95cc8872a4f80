"""Queued decode steps through the whole engine (MLX backend): a conversation with a
follow-up, an edit and a reply stopped mid-way gives, turn by turn, the replies and the
live state that the engine without them (BRANCHCHAT_QUEUE_STEPS=0) gives, greedy and
sampled, on full attention and the hybrid."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from engine import events as ev
from engine.runner import ModelRunner
from engine.sampling import SamplingSettings
from tests.engine.engine_runner import USERS, Runner, assistant, prompt_ids, user

SETTINGS = {
    "greedy": ev.GenerationSettings(SamplingSettings(), max_tokens=20, drafter="off"),
    "sampled": ev.GenerationSettings(
        SamplingSettings(temperature=0.8, top_p=0.9, seed=11), max_tokens=20, drafter="off"
    ),
}


def _conversation(path: Any, settings: ev.GenerationSettings, queue_steps: bool) -> list[Any]:
    """Each turn's (tokens, reason) and the live state's tokens after it."""
    seen: list[Any] = []
    with Runner("mlx", queue_steps=queue_steps) as runner:
        runner.load(path)
        first = (user(USERS[0]),)
        reply = runner.generate(first, settings)
        seen += [(reply.token_ids, reply.reason), runner.state_tokens()]
        follow = (*first, assistant(reply.text), user(USERS[1]))
        reply = runner.generate(follow, settings)
        seen += [(reply.token_ids, reply.reason), runner.state_tokens()]
        edited = (user("Something else entirely."),)  # back to the start of the branch
        reply = runner.generate(edited, settings)
        seen += [(reply.token_ids, reply.reason), runner.state_tokens()]

        def stop_after_five(runner: Runner, event: ev.Event) -> None:
            tokens = sum(len(e.token_ids) for e in streamed if isinstance(e, ev.Tokens))
            if isinstance(event, ev.Tokens) and tokens < 5 <= tokens + len(event.token_ids):
                runner.engine.submit(ev.Stop("stopped"))
            streamed.append(event)

        streamed: list[ev.Event] = []
        runner.on_event = stop_after_five
        last = runner.request(ev.Generate("stopped", (*first, user(USERS[2])), settings))[-1]
        runner.on_event = None
        assert isinstance(last, ev.Finished) and last.reason == ev.FinishReason.STOPPED
        # where the stop lands is the engine thread's timing: the state holds the prompt and
        # what was produced but the pending token, however many that was
        prompt = prompt_ids((*first, user(USERS[2])))
        assert 5 <= len(last.token_ids) < 20
        assert runner.state_tokens() == prompt + list(last.token_ids[:-1])
        again = runner.generate((*first, user(USERS[2])), settings)
        seen += [(again.token_ids, again.reason), runner.state_tokens()]
    return seen


@pytest.mark.parametrize("kind", ["llama", "hybrid"])
@pytest.mark.parametrize("sampling", SETTINGS)
def test_queued_steps_keep_every_reply_and_state(
    kind: str, sampling: str, models: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = SETTINGS[sampling]
    queued = [0]
    real = ModelRunner.launch

    def launch(self: ModelRunner, ids: Any, state: Any, draw: Any = None, taps: Any = None) -> Any:
        queued[0] += isinstance(ids, mx.array)  # on the step before's token, not yet read
        return real(self, ids, state, draw, taps)

    monkeypatch.setattr(ModelRunner, "launch", launch)
    with_queue = _conversation(models[kind], settings, True)
    assert queued[0] >= 60  # four replies of up to 20 tokens, all but a few steps queued
    queued[0] = 0
    assert with_queue == _conversation(models[kind], settings, False)
    assert queued[0] == 0
