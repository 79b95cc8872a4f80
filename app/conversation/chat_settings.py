"""A chat's own settings: its system prompt, sampling, token limits and the thinking switch,
saved with the conversation; the presets they can be picked from. No Qt.

A chat nobody has tuned follows the app's defaults (the Settings dialog); once its
settings are edited they are saved in the conversation's settings column and stay with it.
Presets hold the sampling part only, so picking one never replaces a system prompt.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Protocol

from app.conversation.store import ConversationStore
from engine.events import GenerationSettings, Message
from engine.sampling import SamplingSettings

# what a preset sets; the rest of a chat's settings are its own
APP_DEFAULTS = "App defaults"  # where an untuned chat's sampling comes from (no preset)
PRESET_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens")


class AppDefaults(Protocol):
    """The app-wide defaults a new chat starts from (app.settings.AppSettings has them)."""

    system_prompt: str
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int


@dataclass(frozen=True)
class ChatSettings:
    system_prompt: str = ""
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None  # None: a fresh draw each time
    max_tokens: int = 1024
    context_length: int | None = None  # None: the model's whole context
    thinking: bool = True  # passed to the chat template as enable_thinking
    preset: str = ""  # the preset the sampling came from ("": tuned by hand)

    def __post_init__(self) -> None:
        self.sampling()  # SamplingSettings says what is out of range
        if self.max_tokens < 1:
            raise ValueError("max tokens must be >= 1")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError("context length must be >= 2 tokens (or the model's)")
        if self.seed is not None and self.seed < 0:
            raise ValueError("seed must be >= 0")

    @classmethod
    def from_defaults(cls, app: AppDefaults) -> ChatSettings:
        return cls(
            system_prompt=app.system_prompt,
            temperature=app.temperature,
            top_p=app.top_p,
            top_k=app.top_k,
            max_tokens=app.max_tokens,
            preset=APP_DEFAULTS,
        )

    def sampling(self) -> SamplingSettings:
        return SamplingSettings(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
        )

    def generation_settings(
        self, *, drafter: str, continue_last: bool, raw: bool = False
    ) -> GenerationSettings:
        """raw: plain text completion, for a model without a chat template."""
        return GenerationSettings(
            sampling=self.sampling(),
            max_tokens=self.max_tokens,
            drafter=drafter,
            continue_last=continue_last,
            context_length=self.context_length,
            enable_thinking=self.thinking,
            raw=raw,
        )

    def with_system_prompt(self, messages: Sequence[Message]) -> list[Message]:
        """The branch with the chat's system prompt first; a branch that opens with its own
        system message (an imported chat) keeps it instead of getting a second one."""
        prompt = self.system_prompt.strip()
        if not prompt or (messages and messages[0].role == "system"):
            return list(messages)
        return [Message("system", prompt), *messages]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: ChatSettings | None = None) -> ChatSettings:
        """`base` with each known value of data over it; a value that is missing, of the
        wrong kind or out of range keeps the base's (a file from another version loads)."""
        settings = base or cls()
        for f in fields(cls):
            if f.name not in data:
                continue
            try:
                settings = replace(
                    settings, **{f.name: _coerce(data[f.name], getattr(cls(), f.name), f.name)}
                )
            except (TypeError, ValueError):
                continue
        return settings

    def with_preset(self, preset: Preset) -> ChatSettings:
        return replace(self, **preset.values, preset=preset.name)

    def matches(self, preset: Preset) -> bool:
        return all(getattr(self, name) == value for name, value in preset.values.items())


_OPTIONAL = {"seed": int, "context_length": int}


def _coerce(value: Any, default: Any, name: str) -> Any:
    if name in _OPTIONAL:
        return None if value is None else _OPTIONAL[name](value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise TypeError(f"{name} must be a whole number")
        return int(value)
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a number")
        return float(value)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be text")
    return value


def chat_settings_for(
    store: ConversationStore, conversation_id: str | None, defaults: AppDefaults
) -> ChatSettings:
    """The settings a request in this chat uses: its saved ones over the app's defaults."""
    base = ChatSettings.from_defaults(defaults)
    if conversation_id is None:
        return base
    return ChatSettings.from_dict(store.get_conversation_settings(conversation_id), base)


# -- presets ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    name: str
    values: dict[str, Any]  # PRESET_FIELDS -> value
    is_builtin: bool = False

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("a preset needs a name")
        unknown = set(self.values) - set(PRESET_FIELDS)
        if unknown:
            raise ValueError(f"a preset sets only sampling values, not {sorted(unknown)}")
        ChatSettings(**self.values)  # out-of-range values are refused here

    @classmethod
    def of(cls, name: str, settings: ChatSettings) -> Preset:
        return cls(name.strip(), {f: getattr(settings, f) for f in PRESET_FIELDS})


# Precise: greedy, the same answer every time (and speculative decoding exact); Balanced:
# llama.cpp's defaults; Creative: a flatter distribution with a light repetition penalty.
BUILTIN_PRESETS = (
    Preset("Precise", dict(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0,
                           repetition_penalty=1.0, max_tokens=1024), is_builtin=True),
    Preset("Balanced", dict(temperature=0.8, top_p=0.95, top_k=40, min_p=0.05,
                            repetition_penalty=1.0, max_tokens=1024), is_builtin=True),
    Preset("Creative", dict(temperature=1.1, top_p=0.98, top_k=0, min_p=0.02,
                            repetition_penalty=1.05, max_tokens=2048), is_builtin=True),
)  # fmt: skip


class PresetLibrary:
    """The built-in presets and the person's own, kept in a JSON file (atomically written)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._user: list[Preset] = []
        self.load_error = ""  # why the file could not be read ("" when it could)
        self._load()

    def presets(self) -> list[Preset]:
        return [*BUILTIN_PRESETS, *self._user]

    def get(self, name: str) -> Preset | None:
        return next((p for p in self.presets() if p.name == name), None)

    def save(self, preset: Preset) -> None:
        """Add the preset, or replace the person's preset of that name."""
        if any(p.name == preset.name for p in BUILTIN_PRESETS):
            raise ValueError(f"“{preset.name}” is a built-in preset; pick another name")
        kept = [p for p in self._user if p.name != preset.name]
        self._write([*kept, replace(preset, is_builtin=False)])

    def delete(self, name: str) -> None:
        if any(p.name == name for p in BUILTIN_PRESETS):
            raise ValueError(f"“{name}” is a built-in preset and cannot be deleted")
        self._write([p for p in self._user if p.name != name])

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self._user = [Preset(str(d["name"]), dict(d["values"])) for d in data["presets"]]
        except (OSError, ValueError, KeyError, TypeError) as error:
            self.load_error = f"{self.path.name}: {error}"

    def _write(self, presets: list[Preset]) -> None:
        if self.load_error and self.path.exists():
            # the unreadable file is kept beside the new one, not overwritten
            self.path.replace(self.path.with_name(self.path.name + ".unreadable"))
            self.load_error = ""
        data = {"presets": [{"name": p.name, "values": p.values} for p in presets]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
        os.replace(partial, self.path)
        self._user = presets
