"""The window on a remote server, driven as a person drives it: Model ▸ Connect to
server…, type the URL and key, fetch the models, connect, chat, switch back."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt

from app.conversation.status import MessageStatus
from app.conversation.store_io import export_json, export_markdown
from tests.app.remote.conftest import KEY
from tests.engine.remote.server import start_server

SERVED = "SmolLM2-135M-Instruct.Q4_1.gguf"


def menu_action(window, text):
    for menu_action in window.menuBar().actions():
        for action in menu_action.menu().actions():
            if action.text() == text:
                return action
    raise AssertionError(f"no menu entry {text!r}")


def connect(qtbot, window, url, key="", max_tokens=32):
    window.settings = replace(window.settings, max_tokens=max_tokens)  # short replies
    menu_action(window, "Connect to server…").trigger()
    dialog = window.remote.dialog
    qtbot.waitUntil(dialog.isVisible)
    dialog.url.clear()
    qtbot.keyClicks(dialog.url, url)
    dialog.api_key.clear()
    if key:
        qtbot.keyClicks(dialog.api_key, key)
    qtbot.mouseClick(dialog.fetch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(
        lambda: dialog.model.findText(SERVED, Qt.MatchFlag.MatchEndsWith) >= 0,
        timeout=15000,
    )
    assert "serves 1 model" in dialog.status.text()
    qtbot.mouseClick(dialog.connect_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.header.name.text() == SERVED, timeout=15000)
    return dialog


def test_connect_chat_and_switch_back_to_local(
    qtbot, harness, routed, llama_server, memory_keyring
):
    window = harness.open(engine_factory=routed, with_model=False)
    connect(qtbot, window, llama_server.url)
    assert f"server 127.0.0.1:{llama_server.port}" in window.header.info.text()
    harness.send("Name three colours.", wait=False)
    harness.wait_idle(timeout=60000)
    reply = harness.items()[-1]
    assert reply.role == "assistant" and reply.content
    saved = harness.store.load_tree(window.controller.conversation_id).node(reply.id)
    assert saved.content == reply.content and saved.status in ("done", "length")
    assert saved.stats["server"] == f"127.0.0.1:{llama_server.port}"
    assert "server: no prompt figures" in window.composer.status.text()
    assert harness.engine is None  # the local engine was never started
    # edit the question: a branch, answered by the server from the branch sent whole
    window.controller.edit_message(harness.items()[0].id, "Name three animals.")
    harness.wait_idle(timeout=60000)
    assert [i.role for i in harness.items()] == ["user", "assistant"]
    assert harness.items()[0].content == "Name three animals." and harness.items()[1].content
    # back to a local model: the router sends the next request there
    menu_action(window, "Default model (SmolLM2-135M-Instruct)").trigger()
    qtbot.waitUntil(lambda: window.header.name.text() == "Fake-1M", timeout=10000)
    harness.send("Hello local")
    assert harness.items()[-1].content == "Echo: Hello local"


def test_the_api_key_stays_in_the_keyring(qtbot, harness, routed, keyed_llama_server,
                                          memory_keyring, tmp_path):  # fmt: skip
    window = harness.open(engine_factory=routed, with_model=False)
    connect(qtbot, window, keyed_llama_server.url, KEY)
    harness.send("Hi", wait=False)
    harness.wait_idle(timeout=60000)
    assert harness.items()[-1].content
    assert memory_keyring.passwords == {("branchchat", keyed_llama_server.url): KEY}
    cid = window.controller.conversation_id
    exports = json.dumps(export_json(harness.store, cid)) + export_markdown(harness.store, cid)
    window.qsettings.sync()
    harness.close()
    files = [harness.db_path, *harness.db_path.parent.glob("*.sqlite3-*"), harness.settings_path]
    for path in files:
        assert KEY.encode() not in Path(path).read_bytes(), path
    assert KEY not in exports
    # a new window finds the key again: the dialog opens filled in
    window = harness.open(engine_factory=routed, with_model=False)
    menu_action(window, "Connect to server…").trigger()
    assert window.remote.dialog.api_key.text() == KEY
    assert window.remote.dialog.url.text() == keyed_llama_server.url


def test_without_a_keyring_the_key_lasts_the_session(qtbot, harness, routed,
                                                     keyed_llama_server, no_keyring):  # fmt: skip
    window = harness.open(engine_factory=routed, with_model=False)
    connect(qtbot, window, keyed_llama_server.url, KEY)
    assert "No system keyring is available" in window.banner.message.text()
    assert "kept for this session only" in window.banner.message.text()
    harness.send("Hi", wait=False)
    harness.wait_idle(timeout=60000)
    assert harness.items()[-1].content  # the key worked


def test_wrong_key_shows_a_banner(qtbot, harness, routed, keyed_llama_server, memory_keyring):
    window = harness.open(engine_factory=routed, with_model=False)
    menu_action(window, "Connect to server…").trigger()
    dialog = window.remote.dialog
    qtbot.keyClicks(dialog.url, keyed_llama_server.url)
    qtbot.keyClicks(dialog.api_key, "wrong")
    qtbot.mouseClick(dialog.fetch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "refused the API key" in dialog.status.text(), timeout=15000)
    dialog.model.setEditText("anything")
    qtbot.mouseClick(dialog.connect_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(
        lambda: "refused the API key (401)" in window.banner.message.text(), timeout=15000
    )
    assert window.header.name.text() == "No model loaded"


def test_server_gone_mid_reply_keeps_the_partial_reply(qtbot, harness, routed, memory_keyring,
                                                       tmp_path_factory):  # fmt: skip
    server = start_server(tmp_path_factory)
    try:
        window = harness.open(engine_factory=routed, with_model=False)
        connect(qtbot, window, server.url, max_tokens=1000)
        harness.send("Write a long story about a dragon who learns to paint.", wait=False)
        qtbot.waitUntil(lambda: len(window.controller.active.text or "") > 20
                        if window.controller.active else False, timeout=90000)  # fmt: skip
        server.stop()
        harness.wait_idle(timeout=90000)
        assert "went away mid-reply" in window.banner.message.text()
        reply = harness.items()[-1]
        assert len(reply.content) > 20
        saved = harness.store.load_tree(window.controller.conversation_id).node(reply.id)
        assert saved.status == MessageStatus.STOPPED and saved.content == reply.content
        server.start()
        window.settings = replace(window.settings, max_tokens=24)
        window.controller.regenerate(reply.id)  # the reply's Regenerate
        harness.wait_idle(timeout=60000)
        assert harness.items()[-1].id != reply.id and harness.items()[-1].content
        assert window.banner.isHidden()
    finally:
        server.stop()
