"""The conversation as a tree of messages: pure branch logic, no Qt and no SQL.

Every edit or regenerate adds a sibling instead of overwriting, so a conversation is a
tree. Each node remembers which child is selected; the selected path from the root down
is the branch the window shows. Siblings are ordered by creation (`seq`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from app.conversation.status import CONTINUABLE, MessageStatus


@dataclass(frozen=True, eq=False)
class Node:
    id: str
    parent_id: str | None
    role: str  # "user" | "assistant" | "system"
    content: str
    status: str = MessageStatus.DONE  # a MessageStatus
    created_at: float = 0.0
    seq: int = 0
    selected_child: str | None = None
    stats: dict[str, Any] | None = None
    draft_spans: tuple[tuple[int, int], ...] = field(default=())  # [start, end) char ranges
    thinking: str = ""  # a reasoning model's <think> part, kept apart from the answer

    @property
    def is_continuable(self) -> bool:
        """A reply that did not end on its own: the model can be asked to go on."""
        return self.role == "assistant" and self.status in CONTINUABLE


class MessageTree:
    def __init__(self, nodes: Iterable[Node] = (), selected_root: str | None = None) -> None:
        self._nodes: dict[str, Node] = {}
        self._children: dict[str | None, list[Node]] = {}
        for node in sorted(nodes, key=lambda n: n.seq):
            self._nodes[node.id] = node
            self._children.setdefault(node.parent_id, []).append(node)
        self.selected_root = selected_root

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def node(self, node_id: str) -> Node:
        return self._nodes[node_id]

    def children(self, parent_id: str | None) -> list[Node]:
        return list(self._children.get(parent_id, ()))

    def siblings(self, node_id: str) -> list[Node]:
        """The node and its siblings, oldest first."""
        return self.children(self._nodes[node_id].parent_id)

    def position(self, node_id: str) -> tuple[int, int]:
        """(1-based index among its siblings, number of siblings): the navigator's `2/3`."""
        ids = [n.id for n in self.siblings(node_id)]
        return ids.index(node_id) + 1, len(ids)

    def selected_child(self, parent_id: str | None) -> Node | None:
        """The child on the selected branch; the newest child when none is recorded."""
        children = self._children.get(parent_id)
        if not children:
            return None
        wanted = self.selected_root if parent_id is None else self._nodes[parent_id].selected_child
        for child in children:
            if child.id == wanted:
                return child
        return children[-1]

    def selected_path(self) -> list[Node]:
        """The branch shown: from the selected root down through each selected child."""
        path: list[Node] = []
        node = self.selected_child(None)
        while node is not None:
            path.append(node)
            node = self.selected_child(node.id)
        return path

    def path_to(self, node_id: str) -> list[Node]:
        """Root .. node, inclusive."""
        path = []
        current: str | None = node_id
        while current is not None:
            node = self._nodes[current]
            path.append(node)
            current = node.parent_id
        path.reverse()
        return path

    def sibling_at(self, node_id: str, step: int) -> Node | None:
        """The sibling `step` places away (-1 previous, +1 next), or None past either end."""
        siblings = self.siblings(node_id)
        index = [n.id for n in siblings].index(node_id) + step
        return siblings[index] if 0 <= index < len(siblings) else None
