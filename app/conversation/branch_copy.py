"""Branch into a new chat: a new conversation holding the path from the root to one
message (each message's text, status, figures, drafted spans and thinking), written in
one transaction. The original conversation is only read, never changed."""

from __future__ import annotations

import json
import time

from app.conversation.status import MessageStatus
from app.conversation.store import Conversation, ConversationStore, new_id

BRANCH_MARK = " (branch)"  # a branch copy's title ends with it; the sidebar keeps it in view


def branch_title(title: str) -> str:
    return title if title.endswith(BRANCH_MARK.strip()) else title + BRANCH_MARK


def copy_branch(store: ConversationStore, conversation_id: str, message_id: str) -> Conversation:
    """The new conversation, its path selected, its settings those of the original."""
    original = store.get_conversation(conversation_id)
    if original is None:
        raise KeyError(f"no conversation {conversation_id}")
    path = store.load_tree(conversation_id).path_to(message_id)  # KeyError if not in it
    settings = store.get_conversation_settings(conversation_id)
    now = time.time()
    copy = Conversation(new_id(), branch_title(original.title), now, now)
    ids = [new_id() for _ in path]
    with store.transaction() as db:
        db.execute(
            "INSERT INTO conversations (id, title, created_at, updated_at, selected_root, "
            "settings) VALUES (?,?,?,?,?,?)",
            (copy.id, copy.title, now, now, ids[0], json.dumps(settings) if settings else None),
        )
        for n, node in enumerate(path):
            # A reply still streaming in the original is, in the copy, a stopped one.
            status = (
                MessageStatus.STOPPED if node.status == MessageStatus.STREAMING else node.status
            )
            spans = json.dumps([list(s) for s in node.draft_spans]) if node.draft_spans else None
            db.execute(
                "INSERT INTO messages (id, conversation_id, parent_id, role, content, status, "
                "created_at, selected_child, stats, draft_spans, thinking) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (ids[n], copy.id, ids[n - 1] if n else None, node.role, node.content, status,
                 node.created_at, ids[n + 1] if n + 1 < len(ids) else None,
                 json.dumps(node.stats) if node.stats else None, spans, node.thinking),
            )  # fmt: skip
    return copy
