"""Export and import without Qt: the JSON round trip keeps the whole tree."""

from __future__ import annotations

import json

import pytest

from app.conversation.store_io import export_json, export_markdown, import_json


def make_branchy(store):
    c = store.create_conversation("Branchy")
    q = store.add_message(c.id, None, "user", "question")
    store.add_message(c.id, q.id, "assistant", "first answer", stats={"generated_tokens": 2})
    a2 = store.add_message(
        c.id, q.id, "assistant", "second `answer`", status="stopped", draft_spans=((0, 6),)
    )
    store.add_message(c.id, a2.id, "user", "follow-up")
    store.select(a2.id)
    return c


def shape(store, conversation_id):
    tree = store.load_tree(conversation_id)

    def walk(parent):
        return [
            (n.role, n.content, n.status, n.stats, n.draft_spans, walk(n.id))
            for n in tree.children(parent)
        ]

    return walk(None), [n.content for n in tree.selected_path()]


def test_json_round_trip_keeps_the_tree_and_the_selection(store):
    c = make_branchy(store)
    data = export_json(store, c.id)
    copy = import_json(store, data)
    assert copy.id != c.id and copy.title == "Branchy"
    assert shape(store, copy.id) == shape(store, c.id)
    assert shape(store, c.id)[1] == ["question", "second `answer`", "follow-up"]
    again = export_json(store, copy.id)
    assert [m["content"] for m in again["messages"]] == [m["content"] for m in data["messages"]]


def test_a_bad_import_changes_nothing(store):
    c = make_branchy(store)
    data = export_json(store, c.id)
    data["messages"][-1]["parent_id"] = "nowhere"
    with pytest.raises(ValueError):
        import_json(store, data)
    with pytest.raises(ValueError):
        import_json(store, {"format": "something else"})
    assert [x.id for x in store.list_conversations()] == [c.id]


def test_markdown_export_is_the_selected_branch(store):
    c = make_branchy(store)
    text = export_markdown(store, c.id)
    assert text.startswith("# Branchy\n")
    assert "## You\n\nquestion" in text and "## Assistant\n\nsecond `answer`" in text
    assert "first answer" not in text and "*(stopped)*" in text


def test_json_round_trip_keeps_the_chat_settings_and_each_replys_thinking(store):
    c = store.create_conversation("Thoughtful")
    q = store.add_message(c.id, None, "user", "2+2?")
    store.add_message(c.id, q.id, "assistant", "4", thinking="Two and two make four.")
    store.set_conversation_settings(c.id, {"system_prompt": "Be brief.", "temperature": 0.2})
    copy = import_json(store, export_json(store, c.id))
    assert [n.thinking for n in store.load_tree(copy.id).selected_path()] == [
        "",
        "Two and two make four.",
    ]
    assert store.get_conversation_settings(copy.id) == {
        "system_prompt": "Be brief.",
        "temperature": 0.2,
    }
    text = export_markdown(store, copy.id)
    assert "<details><summary>Thinking</summary>\n\nTwo and two make four." in text


def test_an_export_from_before_settings_and_thinking_still_imports(store):
    c = make_branchy(store)
    data = export_json(store, c.id)
    del data["settings"]
    for m in data["messages"]:
        del m["thinking"]
    copy = import_json(store, data)
    assert shape(store, copy.id) == shape(store, c.id)
    assert store.get_conversation_settings(copy.id) == {}


def test_an_export_of_all_chats_imports_all_or_nothing_with_their_dates(store, tmp_path):
    from app.conversation.store_io import read_imports, write_export_all

    first = make_branchy(store)
    second = store.create_conversation("Second")
    store.add_message(second.id, None, "user", "hello")
    path = tmp_path / "all.json"
    assert write_export_all(store, path) == 2
    dates = {c.title: c.updated_at for c in store.list_conversations()}
    added = read_imports(store, path)
    assert sorted(c.title for c in added) == ["Branchy", "Second"]
    assert {c.title: c.updated_at for c in added} == dates  # kept, not the import's time
    copy = next(c for c in added if c.title == "Branchy")
    assert shape(store, copy.id) == shape(store, first.id)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["conversations"][-1]["messages"][-1]["parent_id"] = "nowhere"  # the last chat broken
    path.write_text(json.dumps(data), encoding="utf-8")
    count = len(store.list_conversations())
    with pytest.raises(ValueError, match="unknown parent"):
        read_imports(store, path)
    assert len(store.list_conversations()) == count  # the first chat was not kept either
