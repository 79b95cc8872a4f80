"""Export a conversation as Markdown (the selected branch) or JSON (the whole tree), or
every chat as one JSON file (a backup), and import the JSON back, or ChatGPT's and Open
WebUI's exports (app.conversation.import_formats reads those). Importing gives every
message a fresh id, so a file can be imported twice, or into the database it came from,
without collisions; a file is imported whole or not at all (one transaction)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

from app.conversation.import_formats import (
    ImportedChat,
    chatgpt_chats,
    is_chatgpt_export,
    is_open_webui_export,
    open_webui_chats,
)
from app.conversation.status import STATUSES, MessageStatus
from app.conversation.store import Conversation, ConversationStore, new_id
from app.conversation.tree import MessageTree, Node

FORMAT = "branchchat.conversation"
ALL_FORMAT = "branchchat.conversations"  # every chat: {"conversations": [FORMAT's, ...]}
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


def write_export_all(store: ConversationStore, path: str | Path) -> int:
    """Write every chat to `path` as one JSON file, newest first; how many."""
    conversations = [export_json(store, c.id) for c in store.list_conversations()]
    data = {"format": ALL_FORMAT, "version": VERSION, "conversations": conversations}
    Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    return len(conversations)


def read_import(store: ConversationStore, path: str | Path) -> Conversation:
    """Import the file at `path`; of several chats in it, the most recent one."""
    return read_imports(store, path)[0]


def read_imports(store: ConversationStore, path: str | Path) -> list[Conversation]:
    """Import every chat in a branchchat, ChatGPT (conversations.json) or Open WebUI JSON
    export, most recently updated first. ValueError says why a file is refused."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(f"not a text file: {error}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON (line {error.lineno}): {error.msg}") from None
    if isinstance(data, dict) and data.get("format") == FORMAT:
        return [import_json(store, data)]
    if isinstance(data, dict) and data.get("format") == ALL_FORMAT:
        return import_json_all(store, data)
    if is_chatgpt_export(data):
        return import_chats(store, chatgpt_chats(data))
    if is_open_webui_export(data):
        return import_chats(store, open_webui_chats(data))
    raise ValueError(
        "not a chat export branchchat reads: expected a branchchat JSON export, ChatGPT's "
        "conversations.json or an Open WebUI chat export"
    )


def import_chats(store: ConversationStore, chats: list[ImportedChat]) -> list[Conversation]:
    """Add the chats, each with its branches and the branch that was on screen selected."""
    if not chats:
        raise ValueError("the file holds no chats")
    added = []
    with store.transaction() as db:
        for chat in chats:
            conversation = Conversation(new_id(), chat.title, chat.created_at, chat.updated_at)
            ids = {m.key: new_id() for m in chat.messages}
            selected = _selected_children(chat)
            db.execute(
                "INSERT INTO conversations (id, title, created_at, updated_at, selected_root, "
                "settings) VALUES (?,?,?,?,?,?)",
                (conversation.id, chat.title, chat.created_at, chat.updated_at,
                 ids.get(selected.get(None, "")), _dumps(chat.settings or None)),
            )  # fmt: skip
            for m in chat.messages:
                db.execute(
                    "INSERT INTO messages (id, conversation_id, parent_id, role, content, "
                    "created_at, selected_child, thinking) VALUES (?,?,?,?,?,?,?,?)",
                    (ids[m.key], conversation.id, ids.get(m.parent_key or ""), m.role,
                     m.content, m.created_at, ids.get(selected.get(m.key, "")), m.thinking),
                )  # fmt: skip
            added.append(conversation)
    return sorted(added, key=lambda c: c.updated_at, reverse=True)


def _selected_children(chat: ImportedChat) -> dict[str | None, str]:
    """parent key (None: the roots) -> the child selected: along the path to the leaf that
    was on screen, else the newest child, as ChatGPT and Open WebUI show a branch."""
    selected: dict[str | None, str] = {}
    for m in chat.messages:  # a later sibling is a later regeneration or edit
        selected[m.parent_key] = m.key
    parent_of = {m.key: m.parent_key for m in chat.messages}
    key = chat.selected_leaf
    while key is not None and key in parent_of:
        selected[parent_of[key]] = key
        key = parent_of[key]
    return selected


def export_markdown(store: ConversationStore, conversation_id: str) -> str:
    conversation = _conversation(store, conversation_id)
    lines = [f"# {conversation.title}", ""]
    for node in store.load_tree(conversation_id).selected_path():
        lines += [f"## {ROLE_TITLES.get(node.role, node.role)}", ""]
        if node.thinking:  # collapsed, as the window shows it
            lines += [
                "<details><summary>Thinking</summary>",
                "",
                node.thinking,
                "",
                "</details>",
                "",
            ]
        lines += [node.content.rstrip(), ""]
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
            "thinking": node.thinking,
        }
        for node in _walk(tree)
    ]
    return {
        "format": FORMAT,
        "version": VERSION,
        "title": conversation.title,
        "created_at": conversation.created_at,
        "updated_at": conversation.updated_at,
        "selected_root": tree.selected_root,
        "settings": store.get_conversation_settings(conversation_id),
        "messages": messages,
    }


def import_json(store: ConversationStore, data: dict[str, Any]) -> Conversation:
    """Add the conversation in `data` as a new one; all or nothing (one transaction)."""
    with store.transaction() as db:
        conversation = _insert_json(db, data)
    return store.get_conversation(conversation.id) or conversation


def import_json_all(store: ConversationStore, data: dict[str, Any]) -> list[Conversation]:
    """Add every chat of an export of all (write_export_all), most recently updated first;
    all or nothing (one transaction)."""
    if data.get("version") != VERSION:
        raise ValueError(f"unsupported export version {data.get('version')!r}")
    chats = data.get("conversations")
    if not isinstance(chats, list) or not chats:
        raise ValueError("'conversations' must be a list of chats, and not empty")
    with store.transaction() as db:
        added = [_insert_json(db, chat) for chat in chats]
    fresh = [store.get_conversation(c.id) or c for c in added]
    return sorted(fresh, key=lambda c: c.updated_at, reverse=True)


def _insert_json(db: sqlite3.Connection, data: dict[str, Any]) -> Conversation:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("not a branchchat conversation export (missing 'format')")
    if data.get("version") != VERSION:
        raise ValueError(f"unsupported export version {data.get('version')!r}")
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise ValueError("'messages' must be a list")
    ids = {m["id"]: new_id() for m in messages}  # old id -> new id
    conversation = Conversation(  # an export made before updated_at was kept: now
        new_id(),
        str(data.get("title") or "Imported chat"),
        float(data.get("created_at") or 0.0),
        float(data.get("updated_at") or time.time()),
    )
    settings = data.get("settings") or None
    if settings is not None and not isinstance(settings, dict):
        raise ValueError("'settings' must be an object")
    db.execute(
        "INSERT INTO conversations (id, title, created_at, updated_at, selected_root, "
        "settings) VALUES (?,?,?,?,?,?)",
        (conversation.id, conversation.title, conversation.created_at, conversation.updated_at,
         ids.get(data.get("selected_root")), _dumps(settings)),
    )  # fmt: skip
    for m in messages:  # parents come before children in an export
        if m["role"] not in ROLE_TITLES or m.get("status", MessageStatus.DONE) not in STATUSES:
            raise ValueError(f"message {m['id']}: bad role or status")
        if m["parent_id"] is not None and m["parent_id"] not in ids:
            raise ValueError(f"message {m['id']}: unknown parent {m['parent_id']}")
        db.execute(
            "INSERT INTO messages (id, conversation_id, parent_id, role, content, status, "
            "created_at, selected_child, stats, draft_spans, thinking) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
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
                str(m.get("thinking") or ""),
            ),
        )
    return conversation


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
