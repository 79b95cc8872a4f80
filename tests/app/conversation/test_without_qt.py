"""The conversation core works where Qt cannot be imported at all (napari's rule: the
core never imports the GUI toolkit). The import contract checks the code; this checks a
real run, in a fresh interpreter whose import of PySide6 or qasync raises."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class NoQt(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("PySide6", "qasync", "shiboken6"):
                raise ImportError(f"{name} is blocked: the conversation core must not need it")
            return None

    sys.meta_path.insert(0, NoQt())

    from app.conversation.status import MessageStatus
    from app.conversation.store import ConversationStore
    from app.conversation.store_io import export_json, export_markdown, import_json
    from app.conversation.streaming_reply import StreamingReply
    from engine.events import Finished, FinishReason, Tokens

    store = ConversationStore(sys.argv[1])
    c = store.create_conversation("no Qt")
    user = store.add_message(c.id, None, "user", "hello")
    reply = store.add_message(c.id, user.id, "assistant", "", status=MessageStatus.STREAMING)
    streaming = StreamingReply.start("r1", c.id, reply.id, "", ())
    streaming.add(Tokens("r1", "Hi there", (1, 2), (False, True), ("Hi", " there")))
    text, spans = streaming.final_text(Finished("r1", FinishReason.EOS, "Hi there", (1, 2)))
    store.update_message(reply.id, content=text, status=MessageStatus.DONE, draft_spans=spans)
    copy = import_json(store, export_json(store, c.id))
    path = [n.content for n in store.load_tree(copy.id).selected_path()]
    assert path == ["hello", "Hi there"], path
    assert "## Assistant" in export_markdown(store, c.id)
    assert not any(name.split(".")[0] in ("PySide6", "qasync") for name in sys.modules)
    print("ok", spans)
    """
)


def test_the_conversation_core_runs_without_qt(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "core.sqlite3")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "((2,", "8),)"]


def test_the_blocker_does_block_qt(tmp_path):
    """The guard itself: the same finder makes an import of PySide6 fail."""
    script = SCRIPT.split("from app.conversation")[0] + "import PySide6.QtCore\n"
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "PySide6 is blocked" in result.stderr
