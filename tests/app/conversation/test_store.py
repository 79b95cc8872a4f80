"""The conversation store on its own (no Qt): transactions, WAL, crash safety, branches."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest

from app.conversation.store import ConversationStore


def test_wal_mode_and_foreign_keys_are_on(store):
    assert store.journal_mode == "wal"
    assert store._db.execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_a_failed_write_rolls_back_and_keeps_what_was_saved(store):
    c = store.create_conversation("t")
    saved = store.add_message(c.id, None, "user", "keep me")
    with pytest.raises(KeyError):
        store.add_message(c.id, "no-such-parent", "assistant", "orphan")
    with pytest.raises(ValueError):
        store.add_message(c.id, saved.id, "assistant", "x", status="bogus")
    with pytest.raises(KeyError):
        store.update_message("no-such-message", content="x")
    with pytest.raises(sqlite3.IntegrityError), store.transaction() as db:
        db.execute("UPDATE messages SET content='changed' WHERE id=?", (saved.id,))
        db.execute("INSERT INTO messages (id, conversation_id, role, content, created_at) "
                   "VALUES ('x', 'no-such-conversation', 'user', 'x', 0)")  # fmt: skip
    tree = store.load_tree(c.id)
    assert [n.content for n in tree.selected_path()] == ["keep me"]
    assert len(tree) == 1


def test_discarding_an_empty_placeholder_never_deletes_content(store):
    c = store.create_conversation("t")
    user = store.add_message(c.id, None, "user", "q")
    empty = store.add_message(c.id, user.id, "assistant", "", status="streaming")
    full = store.add_message(c.id, user.id, "assistant", "an answer")
    assert not store.discard_empty_message(full.id)
    assert not store.discard_empty_message(user.id)
    assert store.discard_empty_message(empty.id)
    assert [n.content for n in store.load_tree(c.id).selected_path()] == ["q", "an answer"]


def test_partial_text_survives_a_crash(tmp_path):
    path = tmp_path / "crash.sqlite3"
    script = textwrap.dedent(
        f"""
        import os
        from app.conversation.store import ConversationStore
        store = ConversationStore({str(path)!r})
        c = store.create_conversation("crash")
        user = store.add_message(c.id, None, "user", "tell me a story")
        reply = store.add_message(c.id, user.id, "assistant", "", status="streaming")
        store.update_message(reply.id, content="Once upon a time")  # a partial save
        os._exit(1)  # the process dies mid-stream, without closing anything
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=str(_repo_root()))
    assert result.returncode == 1
    store = ConversationStore(path)
    conversation = store.list_conversations()[0]
    reply = store.load_tree(conversation.id).selected_path()[-1]
    assert (reply.content, reply.status) == ("Once upon a time", "stopped")
    store.close()


def test_the_selected_branch_is_persisted(tmp_path):
    path = tmp_path / "db.sqlite3"
    store = ConversationStore(path)
    c = store.create_conversation("t")
    q1 = store.add_message(c.id, None, "user", "q1")
    a1 = store.add_message(c.id, q1.id, "assistant", "a1")
    q2 = store.add_message(c.id, a1.id, "user", "q2")
    store.add_message(c.id, q2.id, "assistant", "a2")
    q2b = store.add_message(c.id, a1.id, "user", "q2b")
    store.add_message(c.id, q2b.id, "assistant", "a2b")
    q1b = store.add_message(c.id, None, "user", "q1b")
    assert [n.content for n in store.load_tree(c.id).selected_path()] == ["q1b"]
    store.select(q2.id)  # deep in another branch: every ancestor now points at it
    store.close()

    store = ConversationStore(path)
    tree = store.load_tree(c.id)
    assert [n.content for n in tree.selected_path()] == ["q1", "a1", "q2", "a2"]
    assert tree.position(q2.id) == (1, 2)
    assert tree.position(q1.id) == (1, 2) and tree.position(q1b.id) == (2, 2)
    store.close()


def test_soft_delete_restore_and_purge(store):
    c = store.create_conversation("to delete")
    store.add_message(c.id, None, "user", "findable words")
    store.delete_conversation(c.id)
    assert store.list_conversations() == [] and store.search("findable") == []
    store.restore_conversation(c.id)
    assert [x.id for x in store.list_conversations()] == [c.id]
    store.delete_conversation(c.id)
    assert store.purge_deleted() == 1
    assert store.get_conversation(c.id) is None
    assert store._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_search_is_case_insensitive_and_literal(store):
    c = store.create_conversation("Trip")
    store.add_message(c.id, None, "user", "We sail to LISBON on the 3rd of March, 50% off.")
    store.add_message(c.id, None, "user", "nothing here")
    hits = store.search("lisbon")
    assert [h.conversation_title for h in hits] == ["Trip"]
    assert "LISBON" in hits[0].snippet
    assert len(store.search("50%")) == 1 and store.search("5_%") == []
    assert store.search("  ") == []


def test_rename_and_ordering(store):
    a = store.create_conversation("a", created_at=1.0)
    store.create_conversation("b", created_at=2.0)
    store.rename_conversation(a.id, "renamed")
    assert [c.title for c in store.list_conversations()] == ["b", "renamed"]
    store.add_message(a.id, None, "user", "bump")
    assert [c.title for c in store.list_conversations()] == ["renamed", "b"]


def _repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parents[3]
