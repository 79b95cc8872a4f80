"""What a Hugging Face model folder says about its tokenizer besides tokenizer.json: the
special tokens and BOS flag (tokenizer_config.json), the end-of-generation ids
(generation_config.json), and the chat template from wherever transformers reads it.

Template sources, in transformers' order of precedence: `chat_template.jinja` (the newer
layout), `chat_template.json` ({"chat_template": ...}, written beside processors), then
tokenizer_config.json's `chat_template`: a string, or a list of named templates of which
"default" is the chat one (a list without it is refused, as transformers refuses it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(path, f"unreadable JSON: {e}") from e
    return data if isinstance(data, dict) else {}


def token_text(entry: Any) -> str | None:
    """A special token from tokenizer_config.json: a string or {"content": ...}."""
    if isinstance(entry, dict):
        entry = entry.get("content")
    return entry if isinstance(entry, str) else None


def generation_eos_ids(directory: Path) -> list[int]:
    """generation_config.json's eos_token_id, one or several (llama 3.1 lists three)."""
    ids = read_json(directory / "generation_config.json").get("eos_token_id", [])
    if not isinstance(ids, list):
        ids = [ids]
    return [int(i) for i in ids if i is not None]


def chat_template(directory: Path, config: Mapping[str, Any]) -> str | None:
    """The folder's chat template (module docstring for where from), None when it has none."""
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    json_file = directory / "chat_template.json"
    template = read_json(json_file).get("chat_template") if json_file.is_file() else None
    if template is None:
        template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            names = ", ".join(sorted(str(n) for n in named))
            raise ModelLoadError(
                directory / "tokenizer_config.json",
                f"several chat templates ({names}) and none named 'default' to chat with",
            )
        template = named["default"]
    if template is not None and not isinstance(template, str):
        raise ModelLoadError(directory, f"a chat template that is a {type(template).__name__}")
    return template


def missing_tokenizer_problem(directory: Path) -> str:
    """Why text cannot go in or out of a folder without tokenizer.json ("" when it has one);
    a folder with only a SentencePiece tokenizer.model is refused by the caller."""
    if (directory / "tokenizer.json").is_file():
        return ""
    return (
        f"{directory} has no tokenizer.json, so this model takes token ids only "
        "(python -m engine score --ids-file); text needs its tokenizer.json beside the weights"
    )
