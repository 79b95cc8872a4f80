"""Rows of the conversation store (app/conversation/store.py) as Python values, and a
search hit's one-line snippet."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from app.conversation.tree import Node


def snippet(text: str, query: str, width: int = 80) -> str:
    """One line of `text` around the first match of `query` (case-insensitive)."""
    flat = " ".join(text.split())
    at = flat.casefold().find(query.casefold())
    start = max(0, at - width // 3) if at >= 0 else 0
    piece = flat[start : start + width]
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(flat) else "")


def json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def node_of_row(row: sqlite3.Row) -> Node:
    spans = json.loads(row["draft_spans"]) if row["draft_spans"] else []
    return Node(
        id=row["id"],
        parent_id=row["parent_id"],
        role=row["role"],
        content=row["content"],
        status=row["status"],
        created_at=row["created_at"],
        seq=row["seq"],
        selected_child=row["selected_child"],
        stats=json.loads(row["stats"]) if row["stats"] else None,
        draft_spans=tuple((int(a), int(b)) for a, b in spans),
        thinking=row["thinking"],
    )
