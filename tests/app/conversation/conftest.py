"""The conversation store's tests share one fresh database a test."""

from __future__ import annotations

import pytest

from app.conversation.store import ConversationStore


@pytest.fixture
def store(tmp_path):
    s = ConversationStore(tmp_path / "db.sqlite3")
    yield s
    s.close()
