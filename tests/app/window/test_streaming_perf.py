"""A fast token stream into a long conversation costs the GUI thread one reply's work.

What keeps the event loop free while 2,000 tokens stream below 300 earlier messages is
counted here, not timed: tokens are coalesced into a few pushes to the view, each push
touches the streamed row alone, and no earlier message is parsed again. A wall-clock or
CPU-time bound on the loop's gaps (this test until session 38) failed on a slower CI
machine with no change in the work: the first repaint of the reply took 109 ms there
against 50-66 ms on the Intel Xeon where the bound was set. A test never times; speed
is the benchmarks' (DEVELOPERS' standards).

Each assertion fails for the fault it names: a push for each token gives 2,000 changes
of the reply's row (bound: 40); a reset or relayout of the whole list gives a model reset
or a change of other rows before the stream ends (at the end, one change of every row is
the busy state's: each row shows its actions again); a render cache keyed by the clock
parsed "Question 148?" and "Answer 148 ..." again when the short first reply scrolled
them (checked by hand, session 38).
"""

from __future__ import annotations

import app.messages.rendered_message as rendered_message
from tests.app.messages.ui import open_long_conversation

NUM_TOKENS = 2000
NUM_EARLIER_TURNS = 150  # 300 messages above the streamed reply
MAX_PUSHES = 40  # pushes of the reply to the view: ~30 a second at most while it streams

PAUSE_AFTER = 6  # tokens streamed before the rest: the reply's first line
PAUSED_CHARS = len("The quick **brown** fox jumps over")
QUESTION = "Stream a lot, please."
PIECES = ["The", " quick", " **brown**", " fox", " jumps", " over", " `lazy`", " dogs.", "\n\n"]


def test_a_2000_token_stream_touches_only_the_streamed_reply(harness, qtbot, monkeypatch):
    window = open_long_conversation(
        harness, NUM_EARLIER_TURNS, answer="Answer {turn} with *some* `markdown`."
    )

    reply_text = "".join(PIECES[i % len(PIECES)] for i in range(NUM_TOKENS))
    harness.engine.tokens_override = [PIECES[i % len(PIECES)] for i in range(NUM_TOKENS)]
    harness.engine.pause_after = PAUSE_AFTER
    parsed: list[str] = []
    for name in ("render", "render_plain", "render_appended"):  # whole, or by the tail
        parse = getattr(rendered_message, name)
        spy = lambda text, *args, _parse=parse: parsed.append(text) or _parse(text, *args)  # noqa: E731
        monkeypatch.setattr(rendered_message, name, spy)
    harness.send(QUESTION, wait=False)
    # The question and the waiting reply are in the list; the tokens are still queued.
    model = window.controller.model
    reply_row = len(harness.items()) - 1
    changed_rows: list[tuple[int, int]] = []
    resets: list[str] = []
    model.dataChanged.connect(lambda a, b, *_: changed_rows.append((a.row(), b.row())))
    model.modelReset.connect(lambda: resets.append("reset"))
    model.layoutChanged.connect(lambda *_: resets.append("layout"))
    model.rowsInserted.connect(lambda *_: resets.append("rows"))
    # The first pushes show the reply short, under the earlier messages it then scrolls
    # past: those rows are painted again, from the cache.
    qtbot.waitUntil(lambda: harness.items()[-1].content == reply_text[:PAUSED_CHARS])
    qtbot.wait(100)
    harness.engine.resume()
    harness.wait_idle(timeout=20000)
    qtbot.wait(50)  # the final repaint

    assert harness.items()[-1].content == reply_text
    assert len(harness.items()) == 2 * NUM_EARLIER_TURNS + 2
    assert resets == []
    # The last change is the end of the busy state, which shows every row's actions again.
    assert changed_rows[-1] == (0, reply_row)
    pushes = changed_rows[:-1]
    assert pushes and set(pushes) == {(reply_row, reply_row)}
    assert len(pushes) <= MAX_PUSHES, f"{len(pushes)} pushes for {NUM_TOKENS} tokens"
    assert parsed, "the reply was never rendered"
    # Parsed: the new question, the waiting reply's "…", and the reply as it grew.
    others = [text for text in parsed if not reply_text.startswith(text)]
    assert others == [QUESTION, "…"], others[:4]
    assert len(parsed) <= MAX_PUSHES + 3
