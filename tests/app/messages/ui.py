"""Driving the message list the way a person does: the painted controls are found in the
delegate's geometry (the one the view hit-tests) and clicked with a real mouse event."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt

from tests.app.fake_engine import FakeEngine


def open_with_reply(harness, reply):
    """The window over a FakeEngine whose reply is `reply` (a text, or a function of the
    Generate command)."""

    def factory(listener):
        make = reply if callable(reply) else (lambda _command: reply)
        harness.engine = FakeEngine(listener, reply=make)
        return harness.engine

    return harness.open(engine_factory=factory)


def control_rect(window, row: int, name: str):
    view = window.chat.list_view
    index = window.controller.model.index(row)
    geometry, _ = view.delegate.geometry(view.visualRect(index), index)
    rects = dict(geometry.actions)
    rects.update(prev=geometry.nav_prev, next=geometry.nav_next)
    return rects.get(name)


def click_control(window, qtbot, row: int, name: str, *, scroll: bool = True) -> QPoint:
    """Click the painted control `name` ("Edit", "prev", ...) on message `row`; returns
    where the pointer was."""
    view = window.chat.list_view
    if scroll:
        view.scrollTo(window.controller.model.index(row))
        qtbot.wait(10)
    rect = control_rect(window, row, name)
    assert rect is not None, f"no {name} on row {row}"
    assert view.viewport().rect().contains(rect.center()), "the control is off screen"
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    return rect.center()


class ThinkingEngine(FakeEngine):
    """A reasoning model's reply: `thinking` streamed as ReplyPart.THINKING tokens, then
    the answer, with the engine's Finished (answer in text, the block in thinking)."""

    thinking = "The user greets me. A short friendly answer fits."
    answer = "Hello! How can I help?"

    def _generate(self, command) -> None:
        from engine import events as ev
        from tests.app.fake_engine import split_tokens

        rid = command.request_id
        self.listener(ev.PrefillProgress(rid, 120, 120, 40))
        thought = split_tokens(self.thinking)
        answer = split_tokens(self.answer)
        events = [ev.Tokens(rid, p, (i,), (False,), part="thinking") for i, p in enumerate(thought)]
        events += [ev.Tokens(rid, p, (i,), (False,)) for i, p in enumerate(answer)]
        for i, event in enumerate(events):
            while self.pause_after is not None and i >= self.pause_after:
                if rid in self._stopped or self._resume.wait(0.005):
                    break
            if rid in self._stopped:
                break
            self.listener(event)
        n = len(events)
        stats = ev.Stats(rid, 160, n, 40, 120, 0.05, 2400.0, 50.0, 0, 0, 160 + n, 2048,
                         thinking_tokens=len(thought))  # fmt: skip
        self.listener(ev.Finished(rid, "eos", self.answer, tuple(range(n)), stats,
                                  thinking=self.thinking))  # fmt: skip


def open_thinking(harness):
    def factory(listener):
        harness.engine = ThinkingEngine(listener)
        return harness.engine

    return harness.open(engine_factory=factory)


def open_long_conversation(harness, num_turns: int, answer: str = "Answer {turn} with *some*."):
    """The window over a chat of `num_turns` question and answer pairs, opened."""
    window = harness.open()
    store = window.store
    conversation = store.create_conversation("long one")
    parent = None
    for turn in range(num_turns):
        user = store.add_message(conversation.id, parent, "user", f"Question {turn}?")
        reply = answer.format(turn=turn)
        parent = store.add_message(conversation.id, user.id, "assistant", reply).id
    window.controller.open_conversation(conversation.id)
    harness.qtbot.wait(50)  # laid out and painted once
    return window
