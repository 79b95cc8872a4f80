"""Other apps' chat exports read into one neutral shape: ChatGPT's conversations.json and
Open WebUI's chat export, branches and the branch on screen included. No store, no Qt:
app.conversation.store_io writes the result.

Both formats keep a tree of messages keyed by id. ChatGPT's `mapping` holds nodes
{id, parent, children, message} where message is None for the root and carries
{author: {role}, content: {content_type, parts}, create_time}; `current_node` is the leaf
on screen. Open WebUI's `chat.history.messages` holds {id: {parentId, childrenIds, role,
content, timestamp}} and `history.currentId` is the leaf on screen.

A reply's reasoning goes to its thinking part, as branchchat keeps it: a `<think>` block
at the start (how Open WebUI stored it before 0.5) or Open WebUI's
`<details type="reasoning">` block, and ChatGPT's "thoughts" nodes (o1/o3) for the reply
that follows them.

Nodes that hold no text a person wrote or read (ChatGPT's empty root and hidden system
nodes, browsing displays) are left out and their children hang from the
nearest ancestor kept, so the branches stay as they were. Code an assistant ran and what
it printed are kept, as the code blocks ChatGPT shows.
"""

from __future__ import annotations

import html
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.thinking import split_thinking

ROLES = ("system", "user", "assistant")


@dataclass
class ImportedMessage:
    key: str  # the id in the source file
    parent_key: str | None
    role: str
    content: str
    created_at: float
    thinking: str = ""


@dataclass
class ImportedChat:
    title: str
    created_at: float
    updated_at: float
    messages: list[ImportedMessage]  # parents before children, siblings in the source's order
    selected_leaf: str | None  # the message on screen in the source app
    settings: dict[str, Any] = field(default_factory=dict)  # the chat's own (a system prompt)


def is_chatgpt_export(data: Any) -> bool:
    items = data if isinstance(data, list) else [data]
    return bool(items) and all(isinstance(c, dict) and "mapping" in c for c in items)


def is_open_webui_export(data: Any) -> bool:
    items = data if isinstance(data, list) else [data]
    return bool(items) and all(isinstance(c, dict) and _webui_history(c) is not None for c in items)


# -- ChatGPT ------------------------------------------------------------------------------


def chatgpt_chats(data: Any) -> list[ImportedChat]:
    items = data if isinstance(data, list) else [data]
    chats = []
    for number, item in enumerate(items, 1):
        title = str(item.get("title") or "Imported ChatGPT chat")
        try:
            chats.append(_chatgpt_chat(item, title))
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            raise ValueError(f"ChatGPT conversation {number} (“{title}”): {error}") from None
    return chats


def _chatgpt_chat(item: dict[str, Any], title: str) -> ImportedChat:
    mapping = item["mapping"]
    if not isinstance(mapping, dict):
        raise ValueError("'mapping' must map node ids to nodes")
    parents = {}
    kept: dict[str, tuple[str, str, float]] = {}  # id -> (role, text, time)
    thoughts: dict[str, str] = {}  # id of a "thoughts" node -> its text
    for key, node in mapping.items():
        parent = node.get("parent")
        if parent is not None and parent not in mapping:
            raise ValueError(f"node {key} names a parent {parent} that is not in the file")
        parents[str(key)] = None if parent is None else str(parent)
        message = node.get("message")
        if isinstance(message, dict):
            role = (message.get("author") or {}).get("role")
            content = message.get("content") or {}
            text = _chatgpt_text(content)
            if role == "tool" and content.get("content_type") == "execution_output":
                role = "assistant"  # what the code printed, as ChatGPT shows it under the code
            if role in ROLES and text.strip():
                kept[str(key)] = (role, text, _time(message.get("create_time")))
            elif content.get("content_type") == "thoughts":
                thoughts[str(key)] = "\n\n".join(
                    str(t.get("content", ""))
                    for t in content.get("thoughts") or []
                    if isinstance(t, dict)
                ).strip()
    order = _tree_order(parents, {k: [str(c) for c in n.get("children") or []]
                                  for k, n in mapping.items()})  # fmt: skip
    created = _time(item.get("create_time"))
    messages = _kept_messages(order, parents, kept, default_time=created)
    for m in messages:  # thoughts between a question and its reply belong to the reply
        key: str | None = parents[m.key]
        while m.role == "assistant" and key is not None and key not in kept:
            if key in thoughts:
                m.thinking = "\n\n".join(t for t in (thoughts[key], m.thinking) if t)
            key = parents[key]
    current = item.get("current_node")
    leaf = _nearest_kept(str(current), parents, kept) if current in mapping else None
    updated = _time(item.get("update_time")) or max(
        (m.created_at for m in messages), default=created
    )
    return ImportedChat(title, created or updated, updated, messages, leaf)


def _chatgpt_text(content: dict[str, Any]) -> str:
    kind = content.get("content_type", "text")
    if kind in ("text", "multimodal_text"):
        pieces = []
        for part in content.get("parts") or []:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, dict) and "image" in str(part.get("content_type", "")):
                pieces.append("[image]")  # the picture itself is not in conversations.json
        return "\n".join(p for p in pieces if p)
    if kind == "code":  # the code an assistant ran: shown as a code block
        return f"```\n{content.get('text', '')}\n```" if content.get("text") else ""
    if kind == "execution_output":
        return f"Output:\n```\n{content.get('text', '')}\n```" if content.get("text") else ""
    return ""  # browsing displays, tool calls' plumbing: not a message a person read


# -- Open WebUI ----------------------------------------------------------------------------


def _webui_history(item: dict[str, Any]) -> dict[str, Any] | None:
    chat = item.get("chat", item)
    history = chat.get("history") if isinstance(chat, dict) else None
    if isinstance(history, dict) and isinstance(history.get("messages"), dict):
        return history
    return None


def open_webui_chats(data: Any) -> list[ImportedChat]:
    items = data if isinstance(data, list) else [data]
    chats = []
    for number, item in enumerate(items, 1):
        chat = item.get("chat", item)
        title = str(item.get("title") or chat.get("title") or "Imported Open WebUI chat")
        try:
            chats.append(_open_webui_chat(item, chat, title))
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            raise ValueError(f"Open WebUI chat {number} (“{title}”): {error}") from None
    return chats


def _open_webui_chat(item: dict[str, Any], chat: dict[str, Any], title: str) -> ImportedChat:
    history = _webui_history(item)
    assert history is not None  # is_open_webui_export said so
    nodes: dict[str, dict[str, Any]] = history["messages"]
    parents: dict[str, str | None] = {}
    kept: dict[str, tuple[str, str, float]] = {}
    for key, node in nodes.items():
        parent = node.get("parentId")
        if parent is not None and parent not in nodes:
            raise ValueError(f"message {key} names a parent {parent} that is not in the file")
        parents[str(key)] = None if parent is None else str(parent)
        content = node.get("content")
        text = content if isinstance(content, str) else ""
        if node.get("role") in ROLES and text.strip():
            kept[str(key)] = (node["role"], text, _time(node.get("timestamp")))
    children = {k: [str(c) for c in n.get("childrenIds") or []] for k, n in nodes.items()}
    created = _time(item.get("created_at") or chat.get("timestamp"))
    messages = _kept_messages(_tree_order(parents, children), parents, kept, created)
    for m in messages:
        if m.role == "assistant":
            m.thinking, m.content = _open_webui_reasoning(m.content)
    current = history.get("currentId")
    leaf = _nearest_kept(str(current), parents, kept) if current in nodes else None
    updated = _time(item.get("updated_at")) or max(
        (m.created_at for m in messages), default=created
    )
    params = chat.get("params") if isinstance(chat.get("params"), dict) else {}
    system = params.get("system") or chat.get("system") or ""
    settings = {"system_prompt": system} if isinstance(system, str) and system.strip() else {}
    return ImportedChat(title, created or updated, updated, messages, leaf, settings)


# Open WebUI >= 0.5 writes a reply's reasoning as a collapsed block before the answer:
# <details type="reasoning" done="true" duration="3"><summary>Thought for 3 seconds</summary>
# > quoted reasoning lines </details>
_REASONING = re.compile(
    r'\A\s*<details type="reasoning"[^>]*>\s*(?:<summary>.*?</summary>)?(.*?)</details>\s*',
    re.DOTALL,
)


def _open_webui_reasoning(content: str) -> tuple[str, str]:
    """(thinking, answer) of an Open WebUI reply."""
    match = _REASONING.match(content)
    if match is None:
        return split_thinking(content)  # a raw <think> block, as older versions kept it
    quoted = [line.removeprefix(">").removeprefix(" ") for line in match[1].strip().splitlines()]
    return html.unescape("\n".join(quoted)).strip(), content[match.end() :]


# -- the shared tree walk --------------------------------------------------------------------


def _time(value: Any) -> float:
    """Seconds since the epoch; Open WebUI's newer files count milliseconds."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return 0.0
    return seconds / 1000 if seconds > 1e11 else seconds


def _tree_order(parents: dict[str, str | None], children: dict[str, list[str]]) -> list[str]:
    """Every node, parents first, siblings in the order the source lists them."""
    under: dict[str | None, list[str]] = {}  # from the parent links, which are the truth
    for key, parent in parents.items():
        under.setdefault(parent, []).append(key)
    order: list[str] = []
    seen: set[str] = set()
    queue = deque(under.get(None, []))
    if not queue and parents:
        raise ValueError("the messages form a loop: none is a root")
    while queue:
        key = queue.popleft()
        if key in seen:
            raise ValueError(f"message {key} is reached twice: the tree has a loop")
        seen.add(key)
        order.append(key)
        mine = under.get(key, [])
        listed = [c for c in dict.fromkeys(children.get(key, [])) if parents.get(c) == key]
        # children the parent forgot to list still belong under it, after the listed ones
        is_listed = set(listed)
        queue.extend(listed + [c for c in mine if c not in is_listed])
    if len(seen) != len(parents):
        raise ValueError(f"{len(parents) - len(seen)} messages hang in a loop, off every root")
    return order


def _nearest_kept(
    key: str | None, parents: dict[str, str | None], kept: dict[str, Any]
) -> str | None:
    while key is not None and key not in kept:
        key = parents.get(key)
    return key


def _kept_messages(
    order: Iterable[str],
    parents: dict[str, str | None],
    kept: dict[str, tuple[str, str, float]],
    default_time: float,
) -> list[ImportedMessage]:
    out = []
    for key in order:
        if key in kept:
            role, text, at = kept[key]
            parent = _nearest_kept(parents[key], parents, kept)
            out.append(ImportedMessage(key, parent, role, text, at or default_time))
    return out
