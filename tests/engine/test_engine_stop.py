"""A stop reaches every part of a request (issue 16, point 8): a request stopped while
it waits in the queue leaves the live state untouched, and the replay that brings the
state back to an edit point (up to a whole prefill when no snapshot is left) reports
PrefillProgress and honours a stop between its chunks, leaving an exact state."""

from __future__ import annotations

import numpy as np
import pytest

from engine import events as ev
from engine.sequence import prefill
from engine.state import SnapshotPolicy
from tests.engine.engine_runner import (
    USERS,
    Runner,
    assert_same_reply,
    assistant,
    fresh_finished,
    greedy,
    prompt_ids,
    user,
)

NO_SNAPSHOTS = SnapshotPolicy(stride_capacity=0, marked_capacity=0)


@pytest.mark.parametrize("kind", ["llama", "hybrid"])
def test_a_request_stopped_in_the_queue_leaves_the_state_untouched(kind: str, models: dict) -> None:
    with Runner() as runner:
        runner.load(models[kind])
        first = (user(USERS[0]),)
        first += (assistant(runner.generate(first).text),)
        follow_up = (*first, user(USERS[1]))
        edit = (user("Something else entirely."),)  # would rewind the state to the start
        queued = ev.Generate("queued", edit, greedy())
        held: list[int] = []

        def queue_and_stop(runner: Runner, event: ev.Event) -> None:
            # on the engine thread, busy with the follow-up: the edit can only wait
            is_running = getattr(event, "request_id", "") == "running"
            if is_running and isinstance(event, ev.PrefillProgress) and not held:
                runner.engine.submit(queued)
                runner.engine.submit(ev.Stop("queued"))
                held.append(-1)
            if is_running and isinstance(event, ev.Finished):
                held[:] = runner.state_tokens()  # before the queued request's turn

        runner.on_event = queue_and_stop
        running = runner.request(ev.Generate("running", follow_up, greedy()))
        assert isinstance(running[-1], ev.Finished)
        events = [runner.next_event()]
        runner.on_event = None
        assert events == [ev.Finished("queued", ev.FinishReason.STOPPED, "", (), None)]
        assert runner.state_tokens() == held  # not rolled back, nothing replayed
        assert held[: len(prompt_ids(follow_up))] == prompt_ids(follow_up)
        # and the conversation goes on from the state it kept
        reply = runner.generate((*follow_up, assistant(running[-1].text), user(USERS[2])))
        assert reply.stats is not None
        # the state reaches past the follow-up's prompt: reused, or replayed from a snapshot
        assert reply.stats.reused_tokens + reply.stats.replayed_tokens >= len(prompt_ids(follow_up))
        want = fresh_finished(
            models[kind], (*follow_up, assistant(running[-1].text), user(USERS[2])), greedy()
        )
        assert_same_reply(reply, want)


def test_the_replay_to_an_edit_point_reports_progress(models: dict) -> None:
    """Without snapshots a hybrid replays from the start: the replay is prefill work the
    person waits for, so it is counted in the progress, beside the prompt's new tokens."""
    with Runner(snapshot_policy=NO_SNAPSHOTS, prefill_chunk=16) as runner:
        runner.load(models["hybrid"])
        messages = (user(" ".join(USERS * 3)),)
        runner.generate(messages)
        regenerate = runner.request(ev.Generate("again", messages, greedy()))
        progress = [e for e in regenerate if isinstance(e, ev.PrefillProgress)]
        finished = regenerate[-1]
        assert isinstance(finished, ev.Finished) and finished.stats is not None
        ids = prompt_ids(messages)
        # nothing to rewind to: every prompt token is computed again, the last one too
        assert finished.stats.reused_tokens == 0
        assert finished.stats.prefilled_tokens == len(ids)
        assert finished.stats.replayed_tokens == len(ids) - 1  # all but the new last token
        assert [p.total for p in progress] == [len(ids)] * len(progress)
        done = [p.done for p in progress]
        assert done[0] == 0 and done[-1] == len(ids)
        assert done == sorted(done) and len(done) > len(ids) // 16  # chunk by chunk


def test_a_stop_during_the_replay_leaves_an_exact_state(models: dict) -> None:
    with Runner(snapshot_policy=NO_SNAPSHOTS, prefill_chunk=16) as runner:
        runner.load(models["hybrid"])
        messages = (user(" ".join(USERS * 3)),)
        runner.generate(messages)
        held = runner.state_tokens()
        edit = (user(" ".join(USERS * 3) + " And why?"),)  # replays the whole first message

        def stop_after_two_chunks(runner: Runner, event: ev.Event) -> None:
            if isinstance(event, ev.PrefillProgress) and event.done >= 32:
                runner.on_event = None
                runner.engine.submit(ev.Stop(event.request_id))

        runner.on_event = stop_after_two_chunks
        events = runner.request(ev.Generate("edit", edit, greedy()))
        finished = events[-1]
        assert isinstance(finished, ev.Finished) and finished.reason == ev.FinishReason.STOPPED
        assert not any(isinstance(e, ev.Tokens) for e in events)
        tokens = runner.state_tokens()
        assert 32 <= len(tokens) < len(prompt_ids(messages)) - 1  # stopped inside the replay
        assert tokens == held[: len(tokens)]
        assert finished.stats is not None and finished.stats.prefilled_tokens == len(tokens)
        assert finished.stats.replayed_tokens == len(tokens)
        session = runner.engine.session
        assert session is not None
        # the state is exact: its next logits equal a fresh prefill's
        got = np.asarray(session.runner.forward([5], session.state))[-1]
        fresh = session.runner.new_state()
        want = np.asarray(prefill(session.runner, fresh, [*tokens, 5], chunk_size=16))[-1]
        np.testing.assert_allclose(got, want, atol=1e-4)
