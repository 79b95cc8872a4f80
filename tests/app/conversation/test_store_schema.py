"""Schema version 2: a per-conversation settings column and a per-message thinking column,
reached from a version 1 database (and on through version 3's deleted_at,
test_message_delete.py) without losing a message, a branch choice or a stat."""

from __future__ import annotations

import sqlite3

import pytest

from app.conversation.store import SCHEMA_VERSION, ConversationStore, SchemaError

# The schema as version 1 shipped it (app/conversation/store.py before version 2), kept
# here verbatim so the migration is tested against the real old layout.
SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    selected_root TEXT,
    deleted_at REAL
);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id TEXT REFERENCES messages(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'done',
    created_at REAL NOT NULL,
    selected_child TEXT,
    stats TEXT,
    draft_spans TEXT
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id);
CREATE INDEX IF NOT EXISTS messages_by_parent ON messages(parent_id);
"""


def _write_v1_database(path):
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_V1)
    db.execute("PRAGMA user_version=1")
    db.execute("INSERT INTO conversations VALUES ('c1', 'Old chat', 1.0, 5.0, 'q1', NULL)")
    db.execute("INSERT INTO conversations VALUES ('c2', 'Deleted chat', 2.0, 2.0, NULL, 3.0)")
    rows = [
        ("q1", "c1", None, "user", "first *question*", "done", 1.0, "a1b", None, None),
        ("a1", "c1", "q1", "assistant", "first answer", "done", 2.0, None,
         '{"generated_tokens": 3}', "[[0, 5]]"),
        ("a1b", "c1", "q1", "assistant", "second answer", "stopped", 3.0, None, None, None),
        ("d1", "c2", None, "user", "in the bin", "done", 2.0, None, None, None),
    ]  # fmt: skip
    db.executemany(
        "INSERT INTO messages (id, conversation_id, parent_id, role, content, status, "
        "created_at, selected_child, stats, draft_spans) VALUES (?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    db.commit()
    db.close()


def test_a_version_1_database_migrates_to_version_2_losing_nothing(tmp_path):
    path = tmp_path / "v1.sqlite3"
    _write_v1_database(path)

    store = ConversationStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    assert [c.title for c in store.list_conversations()] == ["Old chat"]
    tree = store.load_tree("c1")
    assert [n.content for n in tree.selected_path()] == ["first *question*", "second answer"]
    first = tree.node("a1")
    assert first.stats == {"generated_tokens": 3} and first.draft_spans == ((0, 5),)
    assert first.thinking == "" and tree.node("a1b").status == "stopped"
    assert store.get_conversation_settings("c1") == {}
    store.restore_conversation("c2")
    assert [n.content for n in store.load_tree("c2").selected_path()] == ["in the bin"]

    # The new columns work on the migrated file, and survive reopening it.
    chat_settings = {"temperature": 0.2, "system_prompt": "Be brief."}
    store.set_conversation_settings("c1", chat_settings)
    store.update_message("a1", thinking="Let me think.")
    store.close()
    store = ConversationStore(path)
    assert store.get_conversation_settings("c1") == chat_settings
    assert store.load_tree("c1").node("a1").thinking == "Let me think."
    store.close()


def test_a_database_from_a_newer_version_is_refused_untouched(tmp_path):
    path = tmp_path / "future.sqlite3"
    _write_v1_database(path)
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.commit()
    db.close()
    with pytest.raises(SchemaError, match="version 99"):
        ConversationStore(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 99
    assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 4
    db.close()


def test_thinking_is_stored_apart_from_the_content(tmp_path):
    store = ConversationStore(tmp_path / "db.sqlite3")
    c = store.create_conversation("t")
    q = store.add_message(c.id, None, "user", "2+2?")
    reply = store.add_message(c.id, q.id, "assistant", "4", thinking="Two and two.")
    assert reply.thinking == "Two and two."
    store.update_message(reply.id, thinking="Two and two make four.", content="4.")
    node = store.load_tree(c.id).node(reply.id)
    assert (node.content, node.thinking) == ("4.", "Two and two make four.")
    store.update_message(reply.id, thinking="")  # cleared on purpose, not ignored
    assert store.load_tree(c.id).node(reply.id).thinking == ""
    store.close()


def test_conversation_settings_round_trip_and_bad_input_is_refused(tmp_path):
    store = ConversationStore(tmp_path / "db.sqlite3")
    c = store.create_conversation("t")
    assert store.get_conversation_settings(c.id) == {}
    store.set_conversation_settings(c.id, {"top_k": 40, "seed": None, "preset": "Precise"})
    assert store.get_conversation_settings(c.id) == {"top_k": 40, "seed": None, "preset": "Precise"}
    with pytest.raises(ValueError, match="JSON"):
        store.set_conversation_settings(c.id, {"bad": object()})
    with pytest.raises(ValueError, match="dict"):
        store.set_conversation_settings(c.id, ["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        store.set_conversation_settings("no-such-chat", {})
    with pytest.raises(KeyError):
        store.get_conversation_settings("no-such-chat")
    assert store.get_conversation_settings(c.id)["preset"] == "Precise"  # nothing lost
    store.close()
