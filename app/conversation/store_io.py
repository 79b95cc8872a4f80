"""Export a conversation as Markdown (the selected branch) or JSON (the whole tree), and
import the JSON back. Importing gives every message a fresh id, so a file can be
imported twice, or into the database it came from, without collisions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

from app.conversation.status import STATUSES, MessageStatus
from app.conversation.store import Conversation, ConversationStore, new_id
from app.conversation.tree import MessageTree, Node

FORMAT = "branchchat.conversation"
VERSION = 1
ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}


class ExportFormat(StrEnum):
    MARKDOWN = "markdown"  # the selected branch, to read
    JSON = "json"  # the whole tree, to import again


def write_export(
    store: ConversationStore, conversation_id: str, fmt: str, path: str | Path
) -> None:
    """Write the conversation to `path` as JSON (fmt "json") or else as Markdown."""
    if fmt == ExportFormat.JSON:
        data = export_json(store, conversation_id)
        text = json.dumps(data, indent=2, ensure_ascii=False)
    else:
        text = export_markdown(store, conversation_id)
    Path(path).write_text(text, encoding="utf-8")


def read_import(store: ConversationStore, path: str | Path) -> Conversation:
    """Import the JSON export at `path` (see import_json)."""
    return import_json(store, json.loads(Path(path).read_text(encoding="utf-8")))


def export_markdown(store: ConversationStore, conversation_id: str) -> str:
    conversation = _conversation(store, conversation_id)
    lines = [f"# {conversation.title}", ""]
    for node in store.load_tree(conversation_id).selected_path():
        lines += [f"## {ROLE_TITLES.get(node.role, node.role)}", "", node.content.rstrip(), ""]
        if node.status == MessageStatus.STOPPED:
            lines += ["*(stopped)*", ""]
    return "\n".join(lines)


def export_json(store: ConversationStore, conversation_id: str) -> dict[str, Any]:
    conversation = _conversation(store, conversation_id)
    tree = store.load_tree(conversation_id)
    messages = [
        {
            "id": node.id,
            "parent_id": node.parent_id,
            "role": node.role,
            "content": node.content,
            "status": node.status,
            "created_at": node.created_at,
            "selected_child": node.selected_child,
            "stats": node.stats,
            "draft_spans": [list(s) for s in node.draft_spans],
        }
        for node in _walk(tree)
    ]
    return {
        "format": FORMAT,
        "version": VERSION,
        "title": conversation.title,
        "created_at": conversation.created_at,
        "selected_root": tree.selected_root,
        "messages": messages,
    }


def import_json(store: ConversationStore, data: dict[str, Any]) -> Conversation:
    """Add the conversation in `data` as a new one; all or nothing (one transaction)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("not a branchchat conversation export (missing 'format')")
    if data.get("version") != VERSION:
        raise ValueError(f"unsupported export version {data.get('version')!r}")
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise ValueError("'messages' must be a list")
    ids = {m["id"]: new_id() for m in messages}  # old id -> new id
    conversation = Conversation(
        new_id(), str(data.get("title") or "Imported chat"), data.get("created_at") or 0.0, 0.0
    )
    with store.transaction() as db:
        db.execute(
            "INSERT INTO conversations (id, title, created_at, updated_at, selected_root) "
            "VALUES (?,?,?,strftime('%s','now'),?)",
            (conversation.id, conversation.title, conversation.created_at,
             ids.get(data.get("selected_root"))),
        )  # fmt: skip
        for m in messages:  # parents come before children in an export
            if m["role"] not in ROLE_TITLES or m.get("status", MessageStatus.DONE) not in STATUSES:
                raise ValueError(f"message {m['id']}: bad role or status")
            if m["parent_id"] is not None and m["parent_id"] not in ids:
                raise ValueError(f"message {m['id']}: unknown parent {m['parent_id']}")
            db.execute(
                "INSERT INTO messages (id, conversation_id, parent_id, role, content, status, "
                "created_at, selected_child, stats, draft_spans) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    ids[m["id"]],
                    conversation.id,
                    ids.get(m["parent_id"]),
                    m["role"],
                    str(m["content"]),
                    m.get("status", MessageStatus.DONE),
                    float(m.get("created_at") or 0.0),
                    ids.get(m.get("selected_child")),
                    _dumps(m.get("stats")),
                    _dumps(m.get("draft_spans") or None),
                ),
            )
    return store.get_conversation(conversation.id) or conversation


def _walk(tree: MessageTree) -> Iterator[Node]:
    """Every node, parents before children (breadth first)."""
    queue = list(tree.children(None))
    while queue:
        node = queue.pop(0)
        yield node
        queue.extend(tree.children(node.id))


def _conversation(store: ConversationStore, conversation_id: str) -> Conversation:
    conversation = store.get_conversation(conversation_id)
    if conversation is None:
        raise KeyError(f"no conversation {conversation_id}")
    return conversation


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value)
