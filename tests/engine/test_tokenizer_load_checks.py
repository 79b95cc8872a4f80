"""A tokenizer is checked against its model at load, and a folder's chat template is read
from wherever transformers reads it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine import __main__ as entry
from engine.config import EngineConfig
from engine.errors import ModelLoadError
from engine.loader import load_model
from engine.tokenizer import Tokenizer
from tests.engine.test_tokenizer import CHATML, tiny_gguf_metadata, write_tiny_hf_dir
from tests.tiny_models import VOCAB_SIZE, make_hf_dir, reference_forward

NUMPY = EngineConfig(backend="numpy")


def test_a_vocabulary_past_the_embedding_is_refused_at_load_with_both_sizes(tmp_path) -> None:
    make_hf_dir(tmp_path / "small", vocab_size=VOCAB_SIZE - 8)  # the tokenizer keeps its ids
    with pytest.raises(ModelLoadError) as info:
        load_model(tmp_path / "small", NUMPY)
    assert f"the tokenizer's vocabulary has {VOCAB_SIZE} token ids" in str(info.value)
    assert f"embedding has {VOCAB_SIZE - 8} rows" in str(info.value)


def test_a_larger_embedding_than_the_vocabulary_loads(tmp_path) -> None:
    # Qwen pads its embedding past the tokenizer's ids: the unused rows are harmless
    make_hf_dir(tmp_path / "padded", vocab_size=VOCAB_SIZE + 8)
    assert load_model(tmp_path / "padded", NUMPY).config.vocab_size == VOCAB_SIZE + 8


@pytest.fixture
def ids_only(tiny_models, tmp_path: Path) -> tuple[Path, object]:
    source, spec = tiny_models.hf("llama")
    target = tmp_path / "no-tokenizer"
    shutil.copytree(source, target)
    (target / "tokenizer.json").unlink()
    return target, spec


def test_a_folder_without_tokenizer_json_scores_ids(ids_only, tmp_path: Path, capsys) -> None:
    model, spec = ids_only
    ids = np.array([5, 17, 3, 99, 42])
    np.save(tmp_path / "ids.npy", ids)
    argv = ["score", "--model", str(model), "--ids-file", str(tmp_path / "ids.npy")]
    argv += ["--kv-dtype", "float32"]  # the float32 bound against the reference
    assert entry.main([*argv, "--out", str(tmp_path / "out.npy"), "--backend", "numpy"]) == 0
    logits = np.load(tmp_path / "out.npy")
    assert np.abs(logits - reference_forward(spec, ids.tolist())).max() <= 1e-4


def test_a_folder_without_tokenizer_json_refuses_text_clearly(ids_only, capsys) -> None:
    argv = ["generate", "--model", str(ids_only[0]), "--backend", "numpy", "--no-prompt-cache"]
    assert entry.main([*argv, "--raw", "--prompt", "hello", "--max-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert "has no tokenizer.json, so this model takes token ids only" in err


def test_perplexity_of_text_needs_the_tokenizer(ids_only, tmp_path: Path, capsys) -> None:
    (tmp_path / "text.txt").write_text("some text", encoding="utf-8")
    argv = ["perplexity", "--model", str(ids_only[0]), "--file", str(tmp_path / "text.txt")]
    assert entry.main([*argv, "--backend", "numpy"]) == 2
    assert "has no tokenizer.json, so this model takes token ids only" in capsys.readouterr().err


def test_a_folder_with_only_a_sentencepiece_model_is_refused(ids_only) -> None:
    (ids_only[0] / "tokenizer.model").write_bytes(b"\x0a\x04<unk>")
    with pytest.raises(ModelLoadError, match="only a SentencePiece tokenizer.model here"):
        load_model(ids_only[0], NUMPY)


# -- where the chat template comes from ---------------------------------------------------------


def test_a_gguf_template_is_read_from_its_metadata() -> None:
    meta = tiny_gguf_metadata("default", **{"tokenizer.chat_template": CHATML})
    assert Tokenizer.from_gguf_metadata(meta, "t.gguf").chat_template == CHATML
    assert (
        Tokenizer.from_gguf_metadata(tiny_gguf_metadata("default"), "t.gguf").chat_template is None
    )


def _with_config_template(directory: Path, template: object) -> None:
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = template
    config_file.write_text(json.dumps(config))


def test_a_list_of_named_templates_gives_the_default_one(tmp_path: Path) -> None:
    write_tiny_hf_dir(tmp_path)
    named = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "CHAT"}]
    _with_config_template(tmp_path, named)
    assert Tokenizer.from_dir(tmp_path).chat_template == "CHAT"


def test_named_templates_without_a_default_are_refused(tmp_path: Path) -> None:
    write_tiny_hf_dir(tmp_path)
    _with_config_template(
        tmp_path, [{"name": "rag", "template": "R"}, {"name": "tool_use", "template": "T"}]
    )
    with pytest.raises(
        ModelLoadError, match=r"several chat templates \(rag, tool_use\) and none named 'default'"
    ):
        Tokenizer.from_dir(tmp_path)


def test_chat_template_json_and_jinja_override_the_config(tmp_path: Path) -> None:
    write_tiny_hf_dir(tmp_path)
    assert Tokenizer.from_dir(tmp_path).chat_template == CHATML
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "FROM JSON"}))
    assert Tokenizer.from_dir(tmp_path).chat_template == "FROM JSON"
    (tmp_path / "chat_template.jinja").write_text("FROM JINJA")
    assert Tokenizer.from_dir(tmp_path).chat_template == "FROM JINJA"


def test_no_template_anywhere_is_none(tmp_path: Path) -> None:
    write_tiny_hf_dir(tmp_path)
    _with_config_template(tmp_path, None)
    assert Tokenizer.from_dir(tmp_path).chat_template is None
