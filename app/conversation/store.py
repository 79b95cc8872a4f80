"""The conversation store: SQLite in the user data directory, no Qt.

WAL mode, one transaction per write, foreign keys on. Deleting a conversation, or a
message with the replies below it, is soft (it can be undone) until `purge_deleted`. A
reply being streamed is written as it grows
(status "streaming"); a store opened after a crash turns those into "stopped" replies,
which the window offers to continue.

The schema is versioned (`PRAGMA user_version`). Opening an older file migrates it in
one transaction by adding columns, so nothing already saved is rewritten; a file from a
newer version is refused untouched rather than half-understood.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from app.conversation.status import STATUSES, MessageStatus
from app.conversation.store_rows import json_text as _json
from app.conversation.store_rows import node_of_row as _node
from app.conversation.store_rows import snippet
from app.conversation.tree import MessageTree, Node

APP_NAME = "branchchat"
SCHEMA_VERSION = 3

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    selected_root TEXT,
    deleted_at REAL,
    settings TEXT
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
    draft_spans TEXT,
    thinking TEXT NOT NULL DEFAULT '',
    deleted_at REAL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id);
CREATE INDEX IF NOT EXISTS messages_by_parent ON messages(parent_id);
"""

# MIGRATIONS[v]: the statements that take a version v file to version v + 1.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 2: per-chat settings (JSON text) and a reply's reasoning part, apart from its content.
    1: (
        "ALTER TABLE conversations ADD COLUMN settings TEXT",
        "ALTER TABLE messages ADD COLUMN thinking TEXT NOT NULL DEFAULT ''",
    ),
    # 3: a message deleted with the replies below it, until restored or purged.
    2: ("ALTER TABLE messages ADD COLUMN deleted_at REAL",),
}


class SchemaError(RuntimeError):
    """The database file was written by a newer branchchat than this one."""


def default_db_path() -> Path:
    return Path(platformdirs.user_data_dir(APP_NAME)) / "conversations.sqlite3"


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Conversation:
    id: str
    title: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class SearchHit:
    conversation_id: str
    conversation_title: str
    message_id: str
    role: str
    snippet: str


class ConversationStore:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: every write goes through `transaction()` explicitly.
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            self._db.close()
            raise SchemaError(
                f"{self.path} was written by a newer branchchat (schema version {version}; "
                f"this one reads up to {SCHEMA_VERSION}). Update branchchat to open it."
            )
        with self.transaction():
            self._migrate(version)
            # A reply that was streaming when the last session ended is a stopped reply.
            self._db.execute("UPDATE messages SET status='stopped' WHERE status='streaming'")

    def close(self) -> None:
        self._db.close()

    def _migrate(self, version: int) -> None:
        """Version 0 is a new file: the whole schema. Otherwise each step up to the current."""
        if version == 0:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
        else:
            for step in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[step]:
                    self._db.execute(statement)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE .. COMMIT, or ROLLBACK on any exception (which is re-raised)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    @property
    def journal_mode(self) -> str:
        return self._db.execute("PRAGMA journal_mode").fetchone()[0]

    # -- conversations ----------------------------------------------------------------

    def create_conversation(self, title: str = "New chat", *, created_at: float | None = None):
        now = time.time() if created_at is None else created_at
        conversation = Conversation(new_id(), title, now, now)
        with self.transaction() as db:
            db.execute(
                "INSERT INTO conversations (id, title, created_at, updated_at) VALUES (?,?,?,?)",
                (conversation.id, title, now, now),
            )
        return conversation

    def list_conversations(self) -> list[Conversation]:
        rows = self._db.execute(
            "SELECT id, title, created_at, updated_at FROM conversations "
            "WHERE deleted_at IS NULL ORDER BY updated_at DESC"
        )
        return [Conversation(*row) for row in rows]

    def get_conversation(self, conversation_id: str) -> Conversation | None:
        row = self._db.execute(
            "SELECT id, title, created_at, updated_at FROM conversations WHERE id=?",
            (conversation_id,),
        ).fetchone()
        return Conversation(*row) if row else None

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        with self.transaction() as db:
            self._require(db, "conversations", conversation_id)
            db.execute("UPDATE conversations SET title=? WHERE id=?", (title, conversation_id))

    def delete_conversation(self, conversation_id: str) -> None:
        """Soft delete: hidden from lists and search until restored or purged."""
        with self.transaction() as db:
            self._require(db, "conversations", conversation_id)
            db.execute(
                "UPDATE conversations SET deleted_at=? WHERE id=?", (time.time(), conversation_id)
            )

    def restore_conversation(self, conversation_id: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE conversations SET deleted_at=NULL WHERE id=?", (conversation_id,))

    def purge_deleted(self) -> int:
        """Remove what was deleted for good; the number of conversations removed."""
        with self.transaction() as db:
            cursor = db.execute("DELETE FROM conversations WHERE deleted_at IS NOT NULL")
            db.execute("DELETE FROM messages WHERE deleted_at IS NOT NULL")
        return cursor.rowcount

    def get_conversation_settings(self, conversation_id: str) -> dict[str, Any]:
        """The chat's own settings as saved (an empty dict when it has none)."""
        row = self._require(self._db, "conversations", conversation_id)
        return json.loads(row["settings"]) if row["settings"] else {}

    def set_conversation_settings(self, conversation_id: str, settings: dict[str, Any]) -> None:
        """Replace the chat's settings; a value JSON cannot hold is refused before writing."""
        if not isinstance(settings, dict):
            raise ValueError(f"conversation settings must be a dict, not {type(settings).__name__}")
        try:
            text = json.dumps(settings)
        except (TypeError, ValueError) as error:
            raise ValueError(f"conversation settings must be plain JSON values: {error}") from None
        with self.transaction() as db:
            self._require(db, "conversations", conversation_id)
            db.execute("UPDATE conversations SET settings=? WHERE id=?", (text, conversation_id))

    # -- messages ---------------------------------------------------------------------

    def add_message(
        self,
        conversation_id: str,
        parent_id: str | None,
        role: str,
        content: str,
        *,
        status: str = MessageStatus.DONE,
        stats: dict[str, Any] | None = None,
        draft_spans: tuple[tuple[int, int], ...] = (),
        thinking: str = "",
        created_at: float | None = None,
        select: bool = True,
    ) -> Node:
        """Add a message under `parent_id` (None: a root) and, by default, select it."""
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        node_id, now = new_id(), time.time() if created_at is None else created_at
        with self.transaction() as db:
            self._require(db, "conversations", conversation_id)
            if parent_id is not None:
                self._require(db, "messages", parent_id, conversation_id=conversation_id)
            cursor = db.execute(
                "INSERT INTO messages (id, conversation_id, parent_id, role, content, status, "
                "created_at, stats, draft_spans, thinking) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (node_id, conversation_id, parent_id, role, content, status, now,
                 _json(stats), _json([list(s) for s in draft_spans]) if draft_spans else None,
                 thinking),
            )  # fmt: skip
            if select:
                self._select(db, conversation_id, parent_id, node_id)
            db.execute("UPDATE conversations SET updated_at=? WHERE id=?", (now, conversation_id))
        return Node(node_id, parent_id, role, content, status, now, cursor.lastrowid or 0,
                    None, stats, tuple(draft_spans), thinking)  # fmt: skip

    def update_message(
        self,
        message_id: str,
        *,
        content: str | None = None,
        status: str | None = None,
        stats: dict[str, Any] | None = None,
        draft_spans: tuple[tuple[int, int], ...] | None = None,
        thinking: str | None = None,
    ) -> None:
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        changes: dict[str, Any] = {"content": content, "status": status, "thinking": thinking}
        changes["stats"] = _json(stats) if stats is not None else None
        if draft_spans is not None:
            changes["draft_spans"] = _json([list(s) for s in draft_spans])
        changes = {k: v for k, v in changes.items() if v is not None}
        if not changes:
            return
        with self.transaction() as db:
            self._require(db, "messages", message_id)
            assignments = ", ".join(f"{column}=?" for column in changes)
            db.execute(
                f"UPDATE messages SET {assignments} WHERE id=?", (*changes.values(), message_id)
            )

    def discard_empty_message(self, message_id: str) -> bool:
        """Remove a reply placeholder that never received text; content is never lost."""
        with self.transaction() as db:
            cursor = db.execute(
                "DELETE FROM messages WHERE id=? AND content='' AND NOT EXISTS "
                "(SELECT 1 FROM messages child WHERE child.parent_id=?)",
                (message_id, message_id),
            )
        return cursor.rowcount == 1

    def delete_message(self, message_id: str) -> tuple[float, int]:
        """Soft delete a message and every message below it: hidden from the tree, search
        and exports until `restore_messages`, removed by `purge_deleted`. Its branch moves
        to the sibling before it (else after it). Returns the stamp `restore_messages`
        takes and how many messages were hidden."""
        with self.transaction() as db:
            row = self._require(db, "messages", message_id)
            if row["deleted_at"] is not None:
                raise KeyError(f"message {message_id} is deleted")
            cid = row["conversation_id"]
            last = "SELECT MAX(deleted_at) FROM messages WHERE conversation_id=?"
            last = db.execute(last, (cid,)).fetchone()[0]  # a stamp is one deletion's own
            stamp = time.time() if last is None else max(time.time(), last + 1e-3)
            db.execute(
                "WITH RECURSIVE below(id) AS (SELECT ? UNION ALL "
                "SELECT m.id FROM messages m JOIN below b ON m.parent_id = b.id) "
                "UPDATE messages SET deleted_at=? WHERE id IN below AND deleted_at IS NULL",
                (message_id, stamp),
            )
            hidden = db.execute("SELECT changes()").fetchone()[0]  # (a WITH has no rowcount)
            parent, seq = row["parent_id"], row["seq"]
            live = "SELECT id FROM messages WHERE conversation_id=? AND parent_id IS ? AND "
            live += "deleted_at IS NULL AND seq {} ? ORDER BY seq {} LIMIT 1"
            for before in (True, False):
                order = ("<", "DESC") if before else (">", "ASC")
                neighbour = db.execute(live.format(*order), (cid, parent, seq)).fetchone()
                if neighbour is not None:
                    self._select(db, cid, parent, neighbour["id"])
                    break
            db.execute("UPDATE conversations SET updated_at=? WHERE id=?", (stamp, cid))
        return stamp, hidden

    def restore_messages(self, conversation_id: str, stamp: float) -> None:
        """Bring back what one `delete_message` hid (its stamp), not earlier deletions."""
        with self.transaction() as db:
            db.execute(
                "UPDATE messages SET deleted_at=NULL WHERE conversation_id=? AND deleted_at=?",
                (conversation_id, stamp),
            )

    def select(self, message_id: str) -> None:
        """Put `message_id` on its conversation's selected branch (every ancestor points at it)."""
        with self.transaction() as db:
            row = self._require(db, "messages", message_id)
            conversation_id = row["conversation_id"]
            while True:
                self._select(db, conversation_id, row["parent_id"], row["id"])
                if row["parent_id"] is None:
                    break
                row = self._require(db, "messages", row["parent_id"])

    def load_tree(self, conversation_id: str) -> MessageTree:
        row = self._db.execute(
            "SELECT selected_root FROM conversations WHERE id=?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise KeyError(f"no conversation {conversation_id}")
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id=? AND deleted_at IS NULL ORDER BY seq",
            (conversation_id,),
        )
        return MessageTree((_node(r) for r in rows), selected_root=row["selected_root"])

    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Messages (in conversations not deleted) whose text contains `query`, newest first."""
        query = query.strip()
        if not query:
            return []
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._db.execute(
            "SELECT m.id, m.role, m.content, c.id AS cid, c.title FROM messages m "
            "JOIN conversations c ON c.id = m.conversation_id "
            "WHERE c.deleted_at IS NULL AND m.deleted_at IS NULL AND m.content LIKE ? ESCAPE '\\' "
            "ORDER BY m.created_at DESC LIMIT ?",
            (pattern, limit),
        )
        return [SearchHit(r["cid"], r["title"], r["id"], r["role"], snippet(r["content"], query))
                for r in rows]  # fmt: skip

    # -- helpers ----------------------------------------------------------------------

    @staticmethod
    def _require(db: sqlite3.Connection, table: str, row_id: str, **match: str) -> sqlite3.Row:
        row = db.execute(f"SELECT * FROM {table} WHERE id=?", (row_id,)).fetchone()
        if row is None or any(row[k] != v for k, v in match.items()):
            raise KeyError(f"no {table[:-1]} {row_id}" + (f" in {match}" if match else ""))
        return row

    @staticmethod
    def _select(db: sqlite3.Connection, conversation_id: str, parent_id: str | None, child: str):
        if parent_id is None:
            db.execute(
                "UPDATE conversations SET selected_root=? WHERE id=?", (child, conversation_id)
            )
        else:
            db.execute("UPDATE messages SET selected_child=? WHERE id=?", (child, parent_id))
