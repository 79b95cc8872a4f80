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
