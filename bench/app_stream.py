"""The window while a long reply streams: how long the GUI thread is kept from its events.

    python -m bench app_stream [--json] [--runs N] [--tokens N] [--turns N] [--rate TOK_S]

The real main window (offscreen unless a display is set) over a conversation of --turns
question/answer pairs, with an engine stand-in that streams --tokens Markdown pieces at
--rate tokens a second (0: as fast as the bridge takes them, the worst case: the window
gets them in a few large batches). A 5 ms timer ticks on the GUI thread from the send to
the reply's end; each gap between ticks is the time the loop could not answer input.
Gaps are read on two clocks: the GUI thread's CPU time (`time.thread_time`: the window's
own work, whatever else the machine runs) and the wall clock (what a person waits, other
processes and the engine thread's GIL included). Also counted: pushes of the reply to the
view, the reply's time from the send to its last repaint, and the GUI thread's CPU time
over it.

tests/app/window/test_streaming_perf.py asserts the work counted (coalesced pushes, no
earlier message parsed again); the time is measured here, never in a test.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.machine import machine, versions, warn_if_busy
from engine import events as ev
from engine.config import EngineConfig

PIECES = ["The", " quick", " **brown**", " fox", " jumps", " over", " `lazy`", " dogs.", "\n\n"]
TICK_MS = 5


class ReplayEngine:
    """The Engine's API over a fixed reply: `pieces` streamed `rate` a second (0: at once)."""

    def __init__(self, listener: Any, pieces: list[str], rate: float) -> None:
        self.listener, self.pieces, self.rate = listener, pieces, rate
        self._thread: threading.Thread | None = None

    def submit(self, command: Any) -> None:
        if isinstance(command, ev.LoadModel):
            self.listener(ev.ModelLoaded(command.path, "Replay", "llama", 1, "F32", 1 << 16, "cpu"))
        elif isinstance(command, ev.Generate):
            self._thread = threading.Thread(target=self._stream, args=(command.request_id,))
            self._thread.start()

    def _stream(self, rid: str) -> None:
        events = [ev.Tokens(rid, p, (i,), (False,)) for i, p in enumerate(self.pieces)]
        start = time.perf_counter()
        for i, event in enumerate(events):
            if self.rate:
                time.sleep(max(0.0, start + i / self.rate - time.perf_counter()))
            self.listener(event)
        n = len(events)
        stats = ev.Stats(rid, 16, n, 0, 16, 0.01, 1600.0, self.rate or 1e6, 0, 0, 16 + n, 1 << 16)
        self.listener(ev.Finished(rid, "eos", "".join(self.pieces), tuple(range(n)), stats))

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(10)


def one_run(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    from PySide6.QtCore import QEventLoop, QSettings, QTimer

    from app.bridge import EngineBridge
    from app.conversation.store import ConversationStore
    from app.theme import LIGHT
    from app.window.main_window import MainWindow

    pieces = [PIECES[i % len(PIECES)] for i in range(args.tokens)]
    store = ConversationStore(directory / "conversations.sqlite3")
    bridge = EngineBridge(lambda listener: ReplayEngine(listener, pieces, args.rate))
    settings = QSettings(str(directory / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(store, bridge, settings, theme=LIGHT)
    window.controller.model_name = "Replay"
    window.resize(1000, 700)
    window.show()
    conversation = store.create_conversation("long one")
    parent = None
    for turn in range(args.turns):
        user = store.add_message(conversation.id, parent, "user", f"Question {turn}?")
        text = f"Answer {turn} with *some* `markdown`."
        parent = store.add_message(conversation.id, user.id, "assistant", text).id
    window.controller.open_conversation(conversation.id)
    settle(0.2)

    pushes: list[int] = []
    window.controller.model.dataChanged.connect(lambda a, b, *_: pushes.append(b.row() - a.row()))
    cpu_gaps: list[float] = []
    wall_gaps: list[float] = []
    last = [time.thread_time(), time.perf_counter()]

    def tick() -> None:
        cpu, wall = time.thread_time(), time.perf_counter()
        cpu_gaps.append(cpu - last[0])
        wall_gaps.append(wall - last[1])
        last[:] = [cpu, wall]

    timer = QTimer(interval=TICK_MS)
    timer.timeout.connect(tick)
    timer.start()
    window.composer.edit.setPlainText("Stream a lot, please.")
    sent, sent_cpu = time.perf_counter(), time.thread_time()
    last[:] = [sent_cpu, sent]
    window.composer.send_button.click()
    # the window's own event loop until the reply ends (a loop polling processEvents would
    # spend the GUI thread's time itself, and be counted as the window's)
    loop = QEventLoop()
    watch = QTimer(interval=20)
    watch.timeout.connect(lambda: loop.quit() if not window.controller.is_busy else None)
    QTimer.singleShot(120_000, loop.quit)
    watch.start()
    loop.exec()
    watch.stop()
    if window.controller.is_busy:
        raise RuntimeError("the reply did not end within 120 s")
    settle(0.05)  # the last repaint
    shown, busy = time.perf_counter() - sent, time.thread_time() - sent_cpu
    timer.stop()
    reply = window.controller.model.items[-1].content
    window.close()
    bridge.close()
    store.close()
    if reply != "".join(pieces):
        raise RuntimeError("the reply shown is not the reply streamed")
    return {
        "max_gap_cpu_ms": 1e3 * max(cpu_gaps),
        "max_gap_wall_ms": 1e3 * max(wall_gaps),
        "p99_gap_wall_ms": 1e3 * sorted(wall_gaps)[int(0.99 * (len(wall_gaps) - 1))],
        "ticks": len(wall_gaps),
        "reply_pushes": sum(1 for rows in pushes if rows == 0),
        "send_to_last_repaint_s": shown,
        "gui_thread_cpu_s": busy,  # the window's own work over that time (its waits excluded)
    }


def settle(seconds: float) -> None:
    from PySide6.QtCore import QCoreApplication

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        QCoreApplication.processEvents()
        time.sleep(0.001)


def main(argv: list[str] | None = None, config: EngineConfig | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench app_stream", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=150, help="question/answer pairs above")
    parser.add_argument("--rate", type=float, default=0.0, help="tokens a second; 0: at once")
    args = parser.parse_args(argv)
    if "DISPLAY" not in os.environ and "WAYLAND_DISPLAY" not in os.environ:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    load = warn_if_busy()
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(one_run(args, Path(tmp)))
    del app
    keys = list(runs[0])
    result = {
        "command": "python -m bench app_stream " + " ".join(argv or []),
        "date": common.now_iso(),
        "settings": vars(args) | {"tick_ms": TICK_MS, "qpa": os.environ.get("QT_QPA_PLATFORM")},
        "figures": {key: common.spread([run[key] for run in runs]) for key in keys},
        "runs": common.rounded(runs),
        "load_average_at_start": load,
        "machine": machine(),
        "versions": versions(),
    }
    return common.report("app_stream", result, args.json, print_table)


def print_table(result: dict[str, Any]) -> None:
    settings = result["settings"]
    rate = settings["rate"] or "at once"
    print(f"{settings['tokens']} tokens ({rate}) below {2 * settings['turns']} messages")
    for key, spread in result["figures"].items():
        print(
            f"  {key:24s} median {spread['median']:9.2f}  min {spread['min']:9.2f}  "
            f"max {spread['max']:9.2f}"
        )
