"""Deleting a message: the message and every reply below it leave the tree, search and
exports, the branch moves to a neighbouring version, one deletion is undone without
bringing back another, and only `purge_deleted` removes rows. A version 2 file (before
the column) migrates keeping every message."""

from __future__ import annotations

import sqlite3

import pytest

from app.conversation.store import SCHEMA_VERSION, ConversationStore
from app.conversation.store_io import export_json


def _chat(store):
    """q -> a1, a2 (selected), a3; a2 -> q2 -> r2."""
    c = store.create_conversation("t")
    q = store.add_message(c.id, None, "user", "question")
    a1 = store.add_message(c.id, q.id, "assistant", "answer one")
    a2 = store.add_message(c.id, q.id, "assistant", "answer two")
    q2 = store.add_message(c.id, a2.id, "user", "follow up")
    r2 = store.add_message(c.id, q2.id, "assistant", "second reply")
    a3 = store.add_message(c.id, q.id, "assistant", "answer three", select=False)
    store.select(r2.id)
    return c, q, a1, a2, q2, r2, a3


def _path(store, cid) -> list[str]:
    return [n.content for n in store.load_tree(cid).selected_path()]


def test_a_deleted_version_takes_its_replies_and_the_branch_moves_back(store):
    c, q, a1, a2, q2, r2, a3 = _chat(store)
    stamp, hidden = store.delete_message(a2.id)
    assert hidden == 3  # a2, q2, r2
    tree = store.load_tree(c.id)
    assert a2.id not in tree and q2.id not in tree and r2.id not in tree
    assert [n.content for n in tree.siblings(a1.id)] == ["answer one", "answer three"]
    assert _path(store, c.id) == ["question", "answer one"]  # the version before it
    assert store.search("follow") == [] and store.search("answer two") == []
    assert "answer two" not in str(export_json(store, c.id))
    store.restore_messages(c.id, stamp)
    store.select(r2.id)
    assert _path(store, c.id) == ["question", "answer two", "follow up", "second reply"]
    assert [h.message_id for h in store.search("follow")] == [q2.id]


def test_the_first_version_hands_the_branch_to_the_next(store):
    c, q, a1, a2, q2, r2, a3 = _chat(store)
    store.select(a1.id)
    store.delete_message(a1.id)
    assert _path(store, c.id) == ["question", "answer two", "follow up", "second reply"]
    store.delete_message(q.id)  # the root: the chat is empty, the chat itself stays
    assert _path(store, c.id) == [] and [x.id for x in store.list_conversations()] == [c.id]


def test_undo_brings_back_one_deletion_not_an_earlier_one(store):
    c, q, a1, a2, q2, r2, a3 = _chat(store)
    first, _ = store.delete_message(r2.id)
    second, hidden = store.delete_message(a2.id)
    assert second != first and hidden == 2  # r2 was gone already: a2 and q2
    store.restore_messages(c.id, second)
    tree = store.load_tree(c.id)
    assert a2.id in tree and q2.id in tree and r2.id not in tree
    with pytest.raises(KeyError, match="deleted"):
        store.delete_message(r2.id)


def test_only_purge_removes_the_rows(store, tmp_path):
    c, q, a1, a2, q2, r2, a3 = _chat(store)
    store.delete_message(a2.id)
    store.close()
    reopened = ConversationStore(tmp_path / "db.sqlite3")  # kept across a restart
    count = "SELECT COUNT(*) FROM messages"
    assert reopened._db.execute(count).fetchone()[0] == 6
    assert reopened.purge_deleted() == 0  # no conversation was deleted
    assert reopened._db.execute(count).fetchone()[0] == 3
    assert [n.content for n in reopened.load_tree(c.id).selected_path()] == [
        "question",
        "answer one",
    ]
    reopened.close()


def test_a_version_2_file_gains_the_column_keeping_every_message(tmp_path):
    path = tmp_path / "v2.sqlite3"
    old = ConversationStore(path)
    c, *_ = _chat(old)
    old.close()
    db = sqlite3.connect(path)  # as version 2 left it: no deleted_at on messages
    db.execute("ALTER TABLE messages DROP COLUMN deleted_at")
    db.execute("PRAGMA user_version=2")
    db.commit()
    db.close()
    store = ConversationStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    assert _path(store, c.id) == ["question", "answer two", "follow up", "second reply"]
    assert len(store.load_tree(c.id)) == 6
    store.close()
