"""A model without a chat template is served as plain text completion: the texts joined
as they are, BOS as the tokenizer says; a chat request to it fails pointing to --raw."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine import __main__ as entry
from engine import events as ev
from engine.config import EngineConfig
from engine.loader import load_model
from engine.session import Session
from tests.engine.engine_runner import Runner, greedy
from tests.tiny_models import reference_forward

PROMPT = "Once upon a time, the sea"


def without_template(source: Path, target: Path) -> Path:
    """A copy of a tiny HF model folder with its chat template taken out, as a base
    model ships."""
    shutil.copytree(source, target)
    config_file = target / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    del config["chat_template"]
    config_file.write_text(json.dumps(config))
    return target


@pytest.fixture(scope="module")
def base_model(tiny_models, tmp_path_factory) -> tuple[Path, object]:
    source, spec = tiny_models.hf("llama")
    return without_template(source, tmp_path_factory.mktemp("base") / "tiny-base"), spec


def greedy_reference(spec: object, ids: list[int], num: int) -> list[int]:
    """The reference forward's greedy continuation of ids, `num` tokens."""
    out = []
    for _ in range(num):
        out.append(int(np.argmax(reference_forward(spec, ids + out)[-1])))
    return out


def test_generate_raw_continues_the_prompt_as_it_is(base_model, capsys) -> None:
    model, spec = base_model
    argv = ["generate", "--model", str(model), "--backend", "numpy", "--no-prompt-cache"]
    argv += ["--raw", "--prompt", PROMPT, "--max-tokens", "6", "--drafter", "off", "--json"]
    assert entry.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    tokenizer = load_model(model, EngineConfig(backend="numpy")).tokenizer
    prompt_ids = tokenizer.encode(PROMPT, add_special=True)
    expected = greedy_reference(spec, prompt_ids, 6)
    stop = next((i + 1 for i, t in enumerate(expected) if t in tokenizer.eos_ids), 6)
    assert out["token_ids"] == expected[:stop]


def test_a_chat_request_to_a_model_without_a_template_points_to_raw(base_model, capsys) -> None:
    argv = ["generate", "--model", str(base_model[0]), "--backend", "numpy", "--no-prompt-cache"]
    assert entry.main([*argv, "--prompt", PROMPT, "--max-tokens", "4"]) == 1
    err = capsys.readouterr().err
    assert "This model has no chat template" in err and "generate --raw" in err


def test_raw_takes_no_system_prompt(base_model, tmp_path, capsys) -> None:
    argv = ["generate", "--model", str(base_model[0]), "--raw", "--system", "be brief"]
    assert entry.main([*argv, "--prompt", PROMPT, "--no-prompt-cache"]) == 2
    assert "--raw continues the prompt as it is" in capsys.readouterr().err
    # said before any model loads: a file that is not there is not what it reports
    argv[2] = str(tmp_path / "absent.gguf")
    assert entry.main([*argv, "--prompt", PROMPT, "--no-prompt-cache"]) == 2
    err = capsys.readouterr().err
    assert "--raw continues the prompt as it is" in err and "absent.gguf" not in err


def test_raw_render_joins_the_texts_with_a_boundary_after_each_and_before_the_last(
    base_model,
) -> None:
    loaded = load_model(base_model[0], EngineConfig(backend="numpy"))
    session = Session(loaded)
    parts = (ev.Message("user", "Once upon a time"), ev.Message("assistant", ", the sea was"))
    rendered = session.render(parts, continue_last=False, raw=True)
    whole = loaded.tokenizer.encode("Once upon a time, the sea was", add_special=True)
    assert rendered.token_ids == whole
    first = loaded.tokenizer.encode("Once upon a time", add_special=True)
    # the last one: where a regenerate of this reply forks (no later turn can mark it)
    assert rendered.boundaries == [len(first), len(whole) - 1]
    assert whole[: len(first)] == first


def test_the_engine_says_whether_a_model_has_a_template(base_model, tiny_models) -> None:
    with Runner() as runner:
        assert runner.load(base_model[0]).has_chat_template is False
        assert runner.load(tiny_models.hf("llama")[0]).has_chat_template is True
        # a raw request through the engine continues the text; the reply comes whole
        finished = runner.generate((ev.Message("user", PROMPT),), greedy(max_tokens=4, raw=True))
        assert finished.reason in ("length", "eos") and finished.token_ids
