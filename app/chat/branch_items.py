"""What the message list shows of a conversation: the selected branch as MessageItems
(the reply being streamed with its live text), and the status line for the open chat.
No widgets and no store here; the controller hands in the tree and the active reply."""

from __future__ import annotations

from app.conversation.status import MessageStatus
from app.conversation.streaming_reply import StreamingReply
from app.conversation.tree import MessageTree
from app.messages.message_model import MessageItem
from engine.stats_format import final_line


def branch_items(tree: MessageTree, active: StreamingReply | None) -> list[MessageItem]:
    items = []
    for node in tree.selected_path():
        index, count = tree.position(node.id)
        stats = node.stats
        thinking_tokens = int((stats or {}).get("thinking_tokens", 0))
        content, spans, status, thinking = (
            node.content,
            node.draft_spans,
            node.status,
            node.thinking,
        )
        if active is not None and active.message_id == node.id:
            content, spans, status = active.text, active.spans, MessageStatus.STREAMING
            thinking, thinking_tokens = active.thinking, active.num_thinking_tokens
        items.append(
            MessageItem(
                node.id,
                node.role,
                content,
                status,
                stats,
                spans,
                index,
                count,
                thinking=thinking,
                thinking_tokens=thinking_tokens,
                created_at=node.created_at,
            )  # fmt: skip
        )
    return items


def last_request_line(
    tree: MessageTree,
    active: StreamingReply | None,
    conversation_id: str | None,
    context_length: int | None,
) -> str:
    """The status line for the open chat: its reply streaming now, or its last one's
    figures; never another chat's."""
    if active is not None and active.conversation_id == conversation_id:
        return active.live_line(context_length) or "Waiting for the model…"
    for node in reversed(tree.selected_path()):
        if node.role == "assistant" and node.stats:
            return final_line(node.stats)
    return ""
