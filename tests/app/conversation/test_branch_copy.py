"""Branch into a new chat, in the store: the path up to a message, every field kept, the
original untouched."""

from __future__ import annotations

import pytest

from app.conversation.branch_copy import copy_branch
from app.conversation.store import ConversationStore


def _dump(store, conversation_id):
    rows = store._db.execute(
        "SELECT * FROM messages WHERE conversation_id=? ORDER BY seq", (conversation_id,)
    )
    return [tuple(r) for r in rows]


def test_the_copy_holds_the_path_and_the_original_is_untouched(tmp_path):
    store = ConversationStore(tmp_path / "db.sqlite3")
    c = store.create_conversation("Trip")
    store.set_conversation_settings(c.id, {"temperature": 0.3})
    q1 = store.add_message(c.id, None, "user", "q1")
    a1 = store.add_message(c.id, q1.id, "assistant", "a1", stats={"generated_tokens": 2},
                           draft_spans=((0, 1),), thinking="hm")  # fmt: skip
    store.add_message(c.id, q1.id, "assistant", "a1b")  # a sibling, not on the path
    q2 = store.add_message(c.id, a1.id, "user", "q2")
    store.add_message(c.id, q2.id, "assistant", "a2")
    before = _dump(store, c.id)

    copy = copy_branch(store, c.id, q2.id)
    assert copy.title == "Trip (branch)" and copy.id != c.id
    path = store.load_tree(copy.id).selected_path()
    assert [(n.role, n.content) for n in path] == [("user", "q1"), ("assistant", "a1"),
                                                   ("user", "q2")]  # fmt: skip
    assert path[1].stats == {"generated_tokens": 2} and path[1].draft_spans == ((0, 1),)
    assert path[1].thinking == "hm"
    assert store.get_conversation_settings(copy.id) == {"temperature": 0.3}
    assert _dump(store, c.id) == before
    with pytest.raises(KeyError):
        copy_branch(store, c.id, "no-such-message")
    assert len(store.list_conversations()) == 2
    store.close()
