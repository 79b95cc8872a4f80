"""Chat settings and presets without Qt: what reaches the engine, what a file holds, and
that a damaged presets file loses nothing."""

from __future__ import annotations

import pytest

from app.conversation.chat_settings import (
    BUILTIN_PRESETS,
    ChatSettings,
    Preset,
    PresetLibrary,
)
from engine.events import Message


def test_the_settings_become_the_engines():
    chat = ChatSettings(temperature=0.3, top_k=5, min_p=0.1, repetition_penalty=1.2, seed=9,
                        max_tokens=77, context_length=600, thinking=False)  # fmt: skip
    generation = chat.generation_settings(drafter="lookup", continue_last=True)
    s = generation.sampling
    assert (s.temperature, s.top_k, s.min_p, s.repetition_penalty, s.seed) == (0.3, 5, 0.1, 1.2, 9)
    assert (generation.max_tokens, generation.context_length) == (77, 600)
    assert generation.enable_thinking is False and generation.continue_last
    assert generation.drafter == "lookup"


def test_the_system_prompt_goes_first_unless_the_branch_has_its_own():
    chat = ChatSettings(system_prompt="  Be brief.  ")
    assert chat.with_system_prompt([Message("user", "hi")]) == [
        Message("system", "Be brief."),
        Message("user", "hi"),
    ]
    imported = [Message("system", "From ChatGPT"), Message("user", "hi")]
    assert chat.with_system_prompt(imported) == imported


@pytest.mark.parametrize(
    "bad",
    [dict(temperature=-1), dict(top_p=0), dict(max_tokens=0), dict(context_length=1),
     dict(seed=-3), dict(repetition_penalty=0)],
)  # fmt: skip
def test_settings_out_of_range_are_refused(bad):
    with pytest.raises(ValueError):
        ChatSettings(**bad)


def test_a_preset_sets_only_sampling_and_is_checked():
    chat = ChatSettings(system_prompt="Mine").with_preset(BUILTIN_PRESETS[2])
    assert chat.system_prompt == "Mine" and chat.preset == "Creative"
    assert chat.matches(BUILTIN_PRESETS[2]) and not chat.matches(BUILTIN_PRESETS[0])
    with pytest.raises(ValueError, match="only sampling"):
        Preset("x", {"system_prompt": "no"})
    with pytest.raises(ValueError):
        Preset("x", {"temperature": -2.0})


def test_user_presets_persist_and_built_ins_stay(tmp_path):
    path = tmp_path / "presets.json"
    library = PresetLibrary(path)
    library.save(Preset.of("Code", ChatSettings(temperature=0.1, top_k=20)))
    with pytest.raises(ValueError, match="built-in"):
        library.save(Preset.of("Balanced", ChatSettings()))
    with pytest.raises(ValueError, match="built-in"):
        library.delete("Precise")
    again = PresetLibrary(path)
    assert [p.name for p in again.presets()] == ["Precise", "Balanced", "Creative", "Code"]
    assert again.get("Code").values["top_k"] == 20


def test_a_damaged_presets_file_is_kept_aside_not_overwritten(tmp_path):
    path = tmp_path / "presets.json"
    path.write_text("{ half a file", encoding="utf-8")
    library = PresetLibrary(path)
    assert library.load_error.startswith("presets.json:")
    assert [p.name for p in library.presets()] == ["Precise", "Balanced", "Creative"]
    library.save(Preset.of("New", ChatSettings()))
    assert (tmp_path / "presets.json.unreadable").read_text() == "{ half a file"
    assert [p.name for p in PresetLibrary(path).presets()][-1] == "New"
