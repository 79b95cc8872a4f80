"""A cheap look at a model file before the engine lets go of the model it holds.

Switching models releases the old model before loading the new one (both never sit in
memory together), so a file that cannot be a loadable model must be refused while the
old one still answers. `probe_model` reads headers only: a GGUF file's header, metadata
and tensor table (to check the file holds every tensor's bytes: a truncated download is
refused here, and so is a tensor type the loader does not convert, such as IQ4_XS), a
model directory's config.json and each safetensors header. What it
cannot see (a tensor of the wrong shape, an unsupported family) the full load finds.

GGUF layout (github.com/ggml-org/ggml/blob/master/docs/gguf.md): magic, version,
tensor count, metadata count, the metadata key/values, the tensor infos (name, dims,
type, offset into the data section), then the data section at the next alignment.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import BinaryIO

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import ModelLoadError
from kernels.gguf_quants import SUPPORTED_TYPES

# GGUF metadata value types -> struct format of a scalar (8: string, 9: array)
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_MAX_COUNT = 1 << 24  # more tensors or keys than this is a corrupt header, not a model


def probe_model(path: str | Path) -> None:
    """Raise ModelLoadError naming the file when `path` cannot be a loadable model."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(path, "no such file or directory")
    if path.is_dir():
        _probe_directory(path)
    else:
        _probe_gguf(path)


def _probe_gguf(path: Path) -> None:
    size = path.stat().st_size
    if size < 32:
        raise ModelLoadError(path, "file is empty or too small to be a GGUF model")
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelLoadError(path, "not a GGUF file (bad magic bytes)")
            version, num_tensors, num_keys = struct.unpack("<IQQ", _read(f, 20))
            if version not in (2, 3) or max(num_tensors, num_keys) > _MAX_COUNT:
                raise ModelLoadError(path, f"unreadable GGUF header (version {version})")
            alignment = 32
            for _ in range(num_keys):
                key = _string(f)
                value = _value(f, struct.unpack("<I", _read(f, 4))[0])
                if key == "general.alignment" and isinstance(value, int) and value > 0:
                    alignment = value
            data_end = 0
            for _ in range(num_tensors):
                name = _string(f)
                (num_dims,) = struct.unpack("<I", _read(f, 4))
                dims = struct.unpack(f"<{num_dims}Q", _read(f, 8 * num_dims))
                kind, offset = struct.unpack("<IQ", _read(f, 12))
                per_block, block_bytes = GGML_QUANT_SIZES[_tensor_type(path, name, kind)]
                elements = 1
                for d in dims:
                    elements *= d
                data_end = max(data_end, offset + elements // per_block * block_bytes)
            data_start = -(-f.tell() // alignment) * alignment
    except (struct.error, EOFError, UnicodeDecodeError, ValueError):
        raise ModelLoadError(path, "truncated or corrupt GGUF header") from None
    if data_start + data_end > size:
        raise ModelLoadError(
            path,
            f"truncated: the tensors need {data_start + data_end:,} bytes, the file has "
            f"{size:,} (an incomplete download?)",
        )


def _tensor_type(path: Path, name: str, kind: int) -> GGMLQuantizationType:
    """The tensor's ggml type, refused by name unless the loader converts it."""
    try:
        tensor_type = GGMLQuantizationType(kind)
    except ValueError:
        raise ModelLoadError(path, f"tensor {name} has an unknown type (id {kind})") from None
    if tensor_type.name not in SUPPORTED_TYPES:
        raise ModelLoadError(
            path,
            f"tensor {name} is {tensor_type.name}, which is not supported; supported: "
            f"{', '.join(SUPPORTED_TYPES)}",
        )
    return tensor_type


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return data


def _string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", _read(f, 8))
    if n > _MAX_COUNT:
        raise ValueError("string too long")
    return _read(f, n).decode("utf-8")


def _value(f: BinaryIO, kind: int) -> object:
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item_kind, n = struct.unpack("<IQ", _read(f, 12))
        if n > _MAX_COUNT:
            raise ValueError("array too long")
        if item_kind in _SCALARS:  # skipped whole: only its length matters here
            _read(f, n * struct.calcsize("<" + _SCALARS[item_kind]))
        else:
            for _ in range(n):
                _value(f, item_kind)
        return None
    if kind not in _SCALARS:
        raise ValueError(f"unknown metadata type {kind}")
    fmt = "<" + _SCALARS[kind]
    return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]


def _probe_directory(path: Path) -> None:
    config = path / "config.json"
    if not config.is_file():
        raise ModelLoadError(path, "no config.json in this directory (not a model directory?)")
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(config, f"unreadable config.json ({exc})") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(config, "config.json does not hold a model configuration")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted({path / name for name in weight_map.values()})
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelLoadError(index, f"unreadable shard index ({exc})") from None
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(path, "no *.safetensors weight files in this directory")
    for file in files:
        _probe_safetensors(file)


def _probe_safetensors(path: Path) -> None:
    """A safetensors file: an 8-byte header length, a JSON header, then the data, which
    must reach every tensor's end offset."""
    if not path.is_file():
        raise ModelLoadError(path, "weight shard named in the index is missing")
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", _read(f, 8))
            if header_len > min(size, 100 << 20):
                raise ValueError("header length past the file")
            header = json.loads(_read(f, header_len))
        ends = [
            int(t["data_offsets"][1])
            for name, t in header.items()
            if name != "__metadata__" and isinstance(t, dict)
        ]
    except (OSError, EOFError, struct.error, ValueError, KeyError, TypeError, IndexError):
        raise ModelLoadError(path, "corrupt or truncated safetensors file (its header)") from None
    if 8 + header_len + max(ends, default=0) > size:
        raise ModelLoadError(path, "corrupt or truncated safetensors file (data missing)")
