"""Branch logic on its own: the selected path, sibling positions, navigation."""

from __future__ import annotations

from app.conversation.tree import MessageTree, Node


def tree(selected_root=None, **selected):
    nodes = [
        Node("q1", None, "user", "q1", seq=1, selected_child=selected.get("q1")),
        Node("a1", "q1", "assistant", "a1", seq=2, selected_child=selected.get("a1")),
        Node("a1b", "q1", "assistant", "a1b", seq=3),
        Node("q2", "a1", "user", "q2", seq=4),
        Node("q1b", None, "user", "q1b", seq=5),
    ]
    return MessageTree(nodes, selected_root=selected_root)


def test_without_a_recorded_choice_the_newest_child_is_shown():
    assert [n.id for n in tree().selected_path()] == ["q1b"]
    assert [n.id for n in tree("q1").selected_path()] == ["q1", "a1b"]


def test_the_recorded_choice_is_followed():
    t = tree("q1", q1="a1")
    assert [n.id for n in t.selected_path()] == ["q1", "a1", "q2"]
    assert t.position("a1") == (1, 2) and t.position("a1b") == (2, 2)
    assert t.position("q2") == (1, 1)


def test_a_stale_choice_falls_back_to_the_newest_child():
    assert [n.id for n in tree("gone", q1="gone").selected_path()] == ["q1b"]


def test_siblings_and_paths():
    t = tree("q1", q1="a1")
    assert t.sibling_at("a1", 1).id == "a1b"
    assert t.sibling_at("a1", -1) is None and t.sibling_at("a1b", 1) is None
    assert [n.id for n in t.path_to("q2")] == ["q1", "a1", "q2"]
    assert [n.id for n in t.children(None)] == ["q1", "q1b"]


def test_continuable_replies():
    assert Node("x", None, "assistant", "t", status="stopped").is_continuable
    assert Node("x", None, "assistant", "t", status="edited").is_continuable
    assert not Node("x", None, "assistant", "t", status="done").is_continuable
    assert not Node("x", None, "user", "t", status="stopped").is_continuable
