"""A reply the context cut off (FinishReason.CONTEXT_FULL) is shown as such, apart from
one cut at max tokens: its own status, kept by the store, a "context full" pill, and a
Continue that asks the engine to go on (which drops the oldest turns when the chat allows
it, or says why it cannot)."""

from __future__ import annotations

import dataclasses

from app.messages.message_layout import STATUS_PILLS
from engine import events as ev
from tests.app.fake_engine import FakeEngine
from tests.app.messages.ui import click_control


class ContextFullEngine(FakeEngine):
    """The fake engine whose first reply ends because the context is full."""

    def __init__(self, listener) -> None:
        self.num_finished = 0

        def listen(event) -> None:
            if isinstance(event, ev.Finished):
                self.num_finished += 1
                if self.num_finished == 1:
                    event = dataclasses.replace(event, reason=ev.FinishReason.CONTEXT_FULL)
            listener(event)

        super().__init__(listen)


def test_a_reply_cut_by_the_context_shows_it_and_can_be_continued(harness, qtbot):
    def factory(listener):
        harness.engine = ContextFullEngine(listener)
        return harness.engine

    window = harness.open(engine_factory=factory)
    harness.send("tell me a long story please")
    reply = harness.items()[-1]
    assert reply.status == "context_full"
    view = window.chat.list_view
    index = window.controller.model.index(1)
    geometry, _ = view.delegate.geometry(view.visualRect(index), index)
    assert geometry.pill is not None  # the painter writes STATUS_PILLS' text in it
    assert STATUS_PILLS[reply.status] == "context full" != STATUS_PILLS["length"]
    stored = harness.store.load_tree(harness.store.list_conversations()[0].id).node(reply.id)
    assert stored.status == "context_full"
    click_control(window, qtbot, 1, "Continue")
    harness.wait_idle()
    assert harness.engine.generates()[-1].settings.continue_last
    assert harness.items()[-1].status == "done"
