"""The person's settings, persisted with QSettings, and how they become engine settings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from PySide6.QtCore import QSettings

from app.settings.send_key import SEND_KEYS, SendKey
from engine.events import DRAFTER_KINDS, DrafterKind, GenerationSettings
from engine.sampling import SamplingSettings

MAX_RECENT_MODELS = 8
# before the one memory budget, a branch-cache-only budget was saved under this key, with
# this default; a value a person chose becomes their memory budget (load_settings)
OLD_CACHE_BUDGET_KEY, OLD_CACHE_BUDGET_DEFAULT_MB = "cache_budget_mb", 2048


TEXT_SIZES = range(-4, 13)  # the chat text's steps from the system's size, a point each


@dataclass(frozen=True)
class AppSettings:
    system_prompt: str = ""
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 0
    max_tokens: int = 1024
    drafter: str = DrafterKind.AUTO.value  # a DrafterKind
    draft_model_path: str = ""
    # the engine's one budget over the computed state (engine/memory.py); 0: automatic,
    # a quarter of this machine's memory
    memory_budget_mb: int = 0
    tint_drafted: bool = True  # with a legend in the footer; Settings turns it off
    send_key: str = SendKey.ENTER.value  # a SendKey
    # the chat's text, in points above (below) the system's size: View ▸ Larger text
    text_size: int = 0
    recent_models: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTER_KINDS:
            raise ValueError(f"unknown drafter {self.drafter!r}")
        if self.send_key not in SEND_KEYS:
            raise ValueError(f"unknown send key {self.send_key!r}")
        if self.text_size not in TEXT_SIZES:
            raise ValueError(f"text_size must be in {TEXT_SIZES[0]}..{TEXT_SIZES[-1]}")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.memory_budget_mb < 0:
            raise ValueError("memory_budget_mb must be >= 0")

    @property
    def memory_budget_bytes(self) -> int | None:
        """What SetMemoryBudget takes: None for the engine's automatic default."""
        return self.memory_budget_mb << 20 if self.memory_budget_mb else None

    def generation_settings(self, *, continue_last: bool = False) -> GenerationSettings:
        sampling = SamplingSettings(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k
        )
        return GenerationSettings(
            sampling=sampling,
            max_tokens=self.max_tokens,
            drafter=self.drafter,
            continue_last=continue_last,
        )

    def with_recent_model(self, path: str) -> AppSettings:
        recent = (path, *(p for p in self.recent_models if p != path))[:MAX_RECENT_MODELS]
        return replace(self, recent_models=recent)


def load_settings(qsettings: QSettings) -> AppSettings:
    """Read what was saved; anything missing or unreadable falls back to the default."""
    defaults = AppSettings()
    values = {}
    for f in fields(AppSettings):
        default = getattr(defaults, f.name)
        raw = qsettings.value(f.name, None)
        if raw is None:
            continue
        try:
            values[f.name] = _convert(raw, default)
        except (TypeError, ValueError):
            continue
    if "memory_budget_mb" not in values:
        values.update(_migrated_cache_budget(qsettings))
    try:
        return AppSettings(**values)
    except ValueError:
        return defaults


def save_settings(qsettings: QSettings, settings: AppSettings) -> None:
    for name, value in asdict(settings).items():
        qsettings.setValue(name, list(value) if isinstance(value, tuple) else value)
    qsettings.remove(OLD_CACHE_BUDGET_KEY)  # migrated into memory_budget_mb by now
    qsettings.sync()


def _migrated_cache_budget(qsettings: QSettings) -> dict[str, int]:
    """The old branch-cache budget as the memory budget, when a person had changed it
    (the old default means they had not: the automatic budget takes over)."""
    try:
        old = int(qsettings.value(OLD_CACHE_BUDGET_KEY, OLD_CACHE_BUDGET_DEFAULT_MB))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return {}
    if old == OLD_CACHE_BUDGET_DEFAULT_MB or old < 0:
        return {}
    return {"memory_budget_mb": old}


def _convert(raw: object, default: object) -> object:
    # QSettings' INI backend gives strings back; the native ones may keep types.
    if isinstance(default, bool):
        return raw if isinstance(raw, bool) else str(raw).lower() in ("true", "1", "yes")
    if isinstance(default, int):
        return int(raw)  # type: ignore[arg-type]
    if isinstance(default, float):
        return float(raw)  # type: ignore[arg-type]
    if isinstance(default, tuple):
        if isinstance(raw, str):
            return (raw,) if raw else ()
        return tuple(str(x) for x in raw)  # type: ignore[union-attr]
    return str(raw)
