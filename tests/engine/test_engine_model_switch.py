"""Switching models (issue 16 point 10, issue 17 item 3) follows one rule: look at the new
file cheaply (engine.model_probe), release the model held, load the new one. So two
models are never held together, and a failed load says which model answers afterwards:

- refused by the look: the old model stays loaded and answering;
- failed in the full load (or while measuring its speed): no model is loaded;
- a bad draft model: the main model is loaded and answers without a draft, and the
  error says it is the draft model that failed, and why.
"""

from __future__ import annotations

import gc
import shutil
import weakref
from pathlib import Path

import numpy as np
import pytest

from engine import engine as engine_module
from engine import events as ev
from engine.session import Session
from tests.engine.engine_runner import (
    USERS,
    Runner,
    assert_same_reply,
    fresh_finished,
    greedy,
    user,
)
from tests.tiny_models import make_llama_gguf

HELLO = (user(USERS[0]),)


@pytest.fixture
def bad_files(tmp_path: Path, models: dict) -> dict[str, Path]:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(Path(models["llama"]).read_bytes()[:-4096])
    misshaped = tmp_path / "misshaped.gguf"  # a sound header: only the full load sees it
    make_llama_gguf(misshaped, replace={"blk.0.attn_q.weight": np.zeros((48, 64), np.float32)})
    return {"cut": cut, "misshaped": misshaped}


def load_events(runner: Runner, command: ev.LoadModel) -> list[ev.Event]:
    """The events of one load, up to its ModelLoaded or Failed, and a Failed that follows
    a ModelLoaded about the draft model."""
    runner.engine.submit(command)
    events: list[ev.Event] = []
    while not events or not isinstance(events[-1], ev.ModelLoaded | ev.Failed):
        events.append(runner.next_event())
    last = events[-1]
    if isinstance(last, ev.ModelLoaded) and last.draft_error:
        events.append(runner.next_event())
    return events


def test_a_file_refused_by_the_look_leaves_the_old_model_answering(
    models: dict, bad_files: dict[str, Path]
) -> None:
    with Runner() as runner:
        runner.load(models["llama"])
        failed = load_events(runner, ev.LoadModel(str(bad_files["cut"])))[-1]
        assert isinstance(failed, ev.Failed)
        assert failed.load_path == str(bad_files["cut"])
        assert failed.active_model == str(models["llama"])
        assert "cut.gguf" in failed.message and "truncated" in failed.message
        assert "still loaded" in failed.message
        assert_same_reply(runner.generate(HELLO), fresh_finished(models["llama"], HELLO, greedy()))


@pytest.mark.parametrize("where", ["load", "calibrate"])
def test_a_failure_after_the_release_leaves_no_model_and_says_so(
    where: str, models: dict, bad_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = bad_files["misshaped"] if where == "load" else models["hybrid"]
    with Runner() as runner:
        runner.load(models["llama"])
        if where == "calibrate":

            def calibrate_fails(self: Session) -> None:
                raise MemoryError

            monkeypatch.setattr(Session, "calibrate", calibrate_fails)
        failed = load_events(runner, ev.LoadModel(str(target)))[-1]
        assert isinstance(failed, ev.Failed)
        assert (failed.load_path, failed.active_model) == (str(target), "")
        released = Path(models["llama"]).stem  # tiny_models names its files in build order
        assert f"No model is loaded now ({released} was released to make room)" in failed.message
        assert runner.engine.session is None
        answer = runner.request(ev.Generate("r", HELLO, greedy()))[-1]
        assert isinstance(answer, ev.Failed) and "No model is loaded" in answer.message


def test_the_old_model_is_released_before_the_new_one_loads(
    models: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    held_while_loading: list[bool] = []
    real_load = engine_module.load_model
    with Runner() as runner:
        runner.load(models["llama"])
        session = runner.engine.session
        assert session is not None
        old = weakref.ref(session.loaded)
        del session

        def load_model(*args: object, **kwargs: object) -> object:
            gc.collect()
            held_while_loading.append(old() is not None)
            return real_load(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(engine_module, "load_model", load_model)
        loaded = runner.load(models["hybrid"])
        assert loaded.path == str(models["hybrid"])
    assert held_while_loading == [False]


@pytest.mark.parametrize("bad", ["cut", "misshaped", "missing"])
def test_a_bad_draft_model_leaves_the_main_model_loaded_without_it(
    bad: str, models: dict, bad_files: dict[str, Path], tmp_path: Path
) -> None:
    draft = str(bad_files[bad]) if bad != "missing" else str(tmp_path / "gone.gguf")
    with Runner() as runner:
        events = load_events(runner, ev.LoadModel(str(models["llama"]), draft_model_path=draft))
        loaded, failed = events[-2:]
        assert isinstance(loaded, ev.ModelLoaded) and isinstance(failed, ev.Failed)
        assert loaded.path == str(models["llama"]) and loaded.draft_model is None
        assert loaded.draft_error.startswith("The draft model could not be loaded")
        assert Path(draft).name in loaded.draft_error
        assert (failed.load_path, failed.active_model) == (draft, str(models["llama"]))
        assert failed.message == loaded.draft_error
        # the main model answers, without a draft: lookup stands in, the reply is the same
        reply = runner.generate(HELLO, greedy("auto"))
        assert_same_reply(reply, fresh_finished(models["llama"], HELLO, greedy()))


def test_a_draft_model_with_another_vocabulary_is_refused_as_the_draft(
    models: dict, tmp_path: Path
) -> None:
    other = tmp_path / "other-vocab.gguf"
    make_llama_gguf(other, vocab_size=64)
    with Runner() as runner:
        events = load_events(runner, ev.LoadModel(str(models["llama"]), str(other)))
        loaded = events[-2]
        assert isinstance(loaded, ev.ModelLoaded) and loaded.draft_model is None
        assert "vocabulary" in loaded.draft_error and "other-vocab" in loaded.draft_error
        assert runner.engine.session is not None


def test_a_good_draft_model_still_loads(models: dict, tmp_path: Path) -> None:
    draft = tmp_path / "draft.gguf"
    shutil.copy(models["llama"], draft)
    with Runner() as runner:
        events = load_events(runner, ev.LoadModel(str(models["llama"]), str(draft)))
        loaded = events[-1]
        assert isinstance(loaded, ev.ModelLoaded)
        assert loaded.draft_model is not None and loaded.draft_error == ""
