"""ChatGPT's conversations.json and Open WebUI's chat export imported into the tree store:
every branch, the branch that was on screen, system messages, empty and tool nodes left
out without breaking the tree, unicode kept. Files are written here in those formats."""

from __future__ import annotations

import json

import pytest

from app.conversation.store_io import read_import, read_imports


def gpt_node(key, parent, children, role=None, text=None, t=None, content=None, hidden=False):
    message = None
    if role is not None:
        message = {
            "id": key,
            "author": {"role": role, "name": None, "metadata": {}},
            "create_time": t,
            "content": content or {"content_type": "text", "parts": [text]},
            "status": "finished_successfully",
            "metadata": {"is_visually_hidden_from_conversation": hidden},
            "recipient": "all",
        }
    return {"id": key, "message": message, "parent": parent, "children": children}


def chatgpt_export() -> list[dict]:
    """Two chats. The first: an empty root, a hidden empty system node, a system prompt,
    a question edited once (two user branches), the second answered twice (regenerated),
    code the assistant ran and its output between a question and its answer; on screen: the edited
    question's second answer."""
    mapping = {
        "root": gpt_node("root", None, ["sys0"]),
        "sys0": gpt_node("sys0", "root", ["sys1"], "system", "", 1.0, hidden=True),
        "sys1": gpt_node("sys1", "sys0", ["u1", "u1b"], "system", "Tu es concis. 🧭", 1.5),
        "u1": gpt_node("u1", "sys1", ["a1"], "user", "Quelle heure est-il à Tōkyō ?", 2.0),
        "a1": gpt_node("a1", "u1", [], "assistant", "Je ne sais pas.", 3.0),
        "u1b": gpt_node("u1b", "sys1", ["a2", "a2b"], "user", "Et à Paris ?", 4.0),
        "a2": gpt_node("a2", "u1b", [], "assistant", "Midi.", 5.0),
        "a2b": gpt_node("a2b", "u1b", ["u3"], "assistant", "Il est 12 h.", 6.0),
        "u3": gpt_node("u3", "a2b", ["call"], "user", "Calcule 2**10", 7.0),
        "call": gpt_node("call", "u3", ["out"], "assistant", t=8.0,
                         content={"content_type": "code", "language": "python", "text": "2**10"}),
        "out": gpt_node("out", "call", ["a4"], "tool", t=8.5,
                        content={"content_type": "execution_output", "text": "1024"}),
        "a4": gpt_node("a4", "out", [], "assistant", "1024", 9.0),
    }  # fmt: skip
    first = {"title": "Heure — 時間", "create_time": 1.0, "update_time": 9.5,
             "mapping": mapping, "current_node": "a4", "id": "c1"}  # fmt: skip
    second = {
        "title": "Older chat",
        "create_time": 0.5,
        "update_time": 0.7,
        "mapping": {
            "r": gpt_node("r", None, ["q"]),
            "q": gpt_node("q", "r", ["x"], "user", "Hi", 0.6),
            "x": gpt_node("x", "q", [], "assistant", "Hello!", 0.7),
        },
        "current_node": "x",
    }
    return [second, first]


def shape(store, conversation_id):
    tree = store.load_tree(conversation_id)

    def walk(parent):
        return [(n.role, n.content, walk(n.id)) for n in tree.children(parent)]

    return walk(None), [n.content for n in tree.selected_path()]


def test_a_chatgpt_export_keeps_every_branch_and_the_branch_on_screen(store, tmp_path):
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(chatgpt_export(), ensure_ascii=False), encoding="utf-8")
    imported = read_imports(store, path)
    assert [c.title for c in imported] == ["Heure — 時間", "Older chat"]
    assert [c.title for c in store.list_conversations()] == ["Heure — 時間", "Older chat"]
    first = imported[0]
    tree, selected = shape(store, first.id)
    assert tree == [
        ("system", "Tu es concis. 🧭", [
            ("user", "Quelle heure est-il à Tōkyō ?", [("assistant", "Je ne sais pas.", [])]),
            ("user", "Et à Paris ?", [
                ("assistant", "Midi.", []),
                ("assistant", "Il est 12 h.", [
                    ("user", "Calcule 2**10", [
                        ("assistant", "```\n2**10\n```", [
                            ("assistant", "Output:\n```\n1024\n```", [("assistant", "1024", [])]),
                        ]),
                    ]),
                ]),
            ]),
        ]),
    ]  # fmt: skip
    assert selected == [
        "Tu es concis. 🧭", "Et à Paris ?", "Il est 12 h.", "Calcule 2**10", "```\n2**10\n```",
        "Output:\n```\n1024\n```", "1024",
    ]  # fmt: skip
    conversation = store.get_conversation(first.id)
    assert (conversation.created_at, conversation.updated_at) == (1.0, 9.5)
    times = [n.created_at for n in store.load_tree(first.id).selected_path()]
    assert times == [1.5, 4.0, 6.0, 7.0, 8.0, 8.5, 9.0]
    assert read_import(store, path).title == "Heure — 時間"  # imports again, fresh ids


def open_webui_export() -> list[dict]:
    messages = {
        "m1": {"id": "m1", "parentId": None, "childrenIds": ["m2", "m2b"], "role": "user",
               "content": "Écris un haïku 🌸", "timestamp": 1700000000},
        "m2": {"id": "m2", "parentId": "m1", "childrenIds": [], "role": "assistant",
               "content": "Vieil étang…", "timestamp": 1700000005, "model": "llama3"},
        "m2b": {"id": "m2b", "parentId": "m1", "childrenIds": ["m3"], "role": "assistant",
                "content": "Le vent d'automne", "timestamp": 1700000010},
        "m3": {"id": "m3", "parentId": "m2b", "childrenIds": ["m4"], "role": "user",
               "content": "Un autre ?", "timestamp": 1700000020},
        "m4": {"id": "m4", "parentId": "m3", "childrenIds": [], "role": "assistant",
               "content": "", "timestamp": 1700000021},  # an answer that never came
    }  # fmt: skip
    chat = {
        "id": "w1",
        "title": "Haïku",
        "models": ["llama3"],
        "params": {"system": "Réponds en français."},
        "history": {"messages": messages, "currentId": "m2"},
        "messages": list(messages.values()),
        "timestamp": 1700000000000,
    }
    return [{"id": "w1", "user_id": "u", "title": "Haïku", "chat": chat,
             "created_at": 1700000000, "updated_at": 1700000030}]  # fmt: skip


def test_an_open_webui_export_keeps_branches_selection_and_system_prompt(store, tmp_path):
    path = tmp_path / "chat-export.json"
    path.write_text(json.dumps(open_webui_export(), ensure_ascii=False), encoding="utf-8")
    conversation = read_import(store, path)
    tree, selected = shape(store, conversation.id)
    assert tree == [
        ("user", "Écris un haïku 🌸", [
            ("assistant", "Vieil étang…", []),
            ("assistant", "Le vent d'automne", [("user", "Un autre ?", [])]),
        ]),
    ]  # fmt: skip
    assert selected == ["Écris un haïku 🌸", "Vieil étang…"]  # currentId: the first answer
    assert store.get_conversation_settings(conversation.id) == {
        "system_prompt": "Réponds en français."
    }
    saved = store.get_conversation(conversation.id)
    assert (saved.title, saved.created_at, saved.updated_at) == (
        "Haïku",
        1700000000.0,
        1700000030.0,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ('{"some": "thing"}', "not a chat export branchchat reads"),
        ('[{"title": "x", "mapping": {"a": {"parent": "gone", "children": []}}}]',
         "names a parent gone"),
        ('[{"title": "x", "mapping": {"a": {"parent": "b"}, "b": {"parent": "a"}}}]', "loop"),
    ],
)  # fmt: skip
def test_a_file_it_cannot_read_is_refused_with_a_reason_and_adds_nothing(
    store, tmp_path, text, message
):
    store.create_conversation("Mine")
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_imports(store, path)
    assert [c.title for c in store.list_conversations()] == ["Mine"]


def test_one_bad_chat_refuses_the_whole_file(store, tmp_path):
    chats = chatgpt_export()
    chats.append({"title": "Broken", "mapping": {"a": {"parent": "zz", "children": []}}})
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(chats), encoding="utf-8")
    with pytest.raises(ValueError, match="Broken"):
        read_imports(store, path)
    assert store.list_conversations() == []


def test_reasoning_is_imported_as_the_replys_thinking(store, tmp_path):
    mapping = {
        "r": gpt_node("r", None, ["q"]),
        "q": gpt_node("q", "r", ["th"], "user", "Is 91 prime?", 1.0),
        "th": gpt_node("th", "q", ["recap"], "assistant", t=1.5, content={
            "content_type": "thoughts",
            "thoughts": [{"summary": "Factor", "content": "91 = 7 × 13."}],
        }),
        "recap": gpt_node("recap", "th", ["a"], "assistant", t=1.6, content={
            "content_type": "reasoning_recap", "content": "Thought for 2 seconds",
        }),
        "a": gpt_node("a", "recap", [], "assistant", "No: 7 × 13.", 2.0),
    }  # fmt: skip
    gpt = tmp_path / "conversations.json"
    gpt.write_text(json.dumps([{"title": "o3", "mapping": mapping, "current_node": "a"}]))
    conversation = read_import(store, gpt)
    path = store.load_tree(conversation.id).selected_path()
    assert [(n.role, n.content, n.thinking) for n in path] == [
        ("user", "Is 91 prime?", ""),
        ("assistant", "No: 7 × 13.", "91 = 7 × 13."),
    ]

    export = open_webui_export()
    nodes = export[0]["chat"]["history"]["messages"]
    nodes["m2"]["content"] = (
        '<details type="reasoning" done="true" duration="3">\n<summary>Thought for 3 seconds'
        "</summary>\n> A haiku has 5-7-5 syllables.\n>\n> &quot;Old pond&quot; first.\n"
        "</details>\nVieil étang…"
    )
    nodes["m2b"]["content"] = "<think>\nAutumn, then.\n</think>\n\nLe vent d'automne"
    webui = tmp_path / "webui.json"
    webui.write_text(json.dumps(export, ensure_ascii=False), encoding="utf-8")
    conversation = read_import(store, webui)
    replies = store.load_tree(conversation.id).children(
        store.load_tree(conversation.id).selected_path()[0].id
    )
    assert [(n.content, n.thinking) for n in replies] == [
        ("Vieil étang…", 'A haiku has 5-7-5 syllables.\n\n"Old pond" first.'),
        ("Le vent d'automne", "Autumn, then."),
    ]
