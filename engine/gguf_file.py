"""Read a GGUF file: its metadata and its tensors, block quantizations made affine.

Layout (github.com/ggml-org/ggml/blob/master/docs/gguf.md): magic, version, tensor
count, metadata count, the metadata key/values, the tensor infos (name, dims, type,
offset), then the data section at the next multiple of `general.alignment`. The file is
memory-mapped and each tensor converted from its mapped bytes, a few rows at a time
(kernels.gguf_quants), so no dense copy of a quantized tensor is ever made here.

The header is parsed here rather than by gguf.GGUFReader, whose per-element field
parts take ~7 s for a 262k-token vocabulary (Gemma 3) where this takes ~0.1 s; the gguf
package still names the tensor types and their block sizes. Metadata comes back with
the types mx.load gave (str, list of str, mx.array scalars and arrays), which the family
config readers and Tokenizer.from_gguf_metadata read.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import ModelLoadError
from kernels import gguf_quants
from kernels.quantized import QuantizedWeight

# GGUF metadata value types -> NumPy dtype of a scalar (8: string, 9: array)
_SCALARS = {
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    6: np.float32,
    7: np.bool_,
    10: np.uint64,
    11: np.int64,
    12: np.float64,
}
_STRING, _ARRAY = 8, 9
_MAX_COUNT = 1 << 24  # more tensors, keys or items than this is a corrupt header
_U64 = struct.Struct("<Q")
_DENSE = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


class _Cursor:
    """Little-endian reads from the mapped header; struct.error past the end."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        values = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        n = self.take("Q")
        if n > _MAX_COUNT or self.pos + n > len(self.buf):
            raise ValueError("string past the end of the header")
        text = self.buf[self.pos : self.pos + n].decode("utf-8")
        self.pos += n
        return text

    def strings(self, n: int) -> list[str]:
        """n strings in a row (a vocabulary: 262k for Gemma 3), without per-item calls."""
        buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
        out = []
        for _ in range(n):
            (size,) = unpack(buf, pos)
            out.append(buf[pos + 8 : pos + 8 + size].decode("utf-8"))
            pos += 8 + size
        if pos > len(buf):
            raise ValueError("string array past the end of the header")
        self.pos = pos
        return out

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, n = self.take("IQ")
            if n > _MAX_COUNT:
                raise ValueError("array too long")
            if item_kind == _STRING:
                return self.strings(n)
            if item_kind not in _SCALARS:
                raise ValueError(f"unsupported metadata array of type {item_kind}")
            dtype = np.dtype(_SCALARS[item_kind]).newbyteorder("<")
            if self.pos + n * dtype.itemsize > len(self.buf):
                raise ValueError("array past the end of the header")
            items = np.frombuffer(self.buf, dtype, n, self.pos).copy()
            self.pos += n * dtype.itemsize
            return _mx(items)
        if kind not in _SCALARS:
            raise ValueError(f"unknown metadata type {kind}")
        dtype = np.dtype(_SCALARS[kind]).newbyteorder("<")
        item = np.frombuffer(self.buf, dtype, 1, self.pos).reshape(())
        self.pos += dtype.itemsize
        return _mx(item)


def _mx(a: np.ndarray) -> mx.array:
    # MLX keeps float64 off the GPU: metadata floats are float32, as mx.load gave them
    return mx.array(a.astype(np.float32) if a.dtype == np.float64 else a)


def read_gguf_file(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, tensors by GGUF name) of the GGUF file at `path`: dense tensors as
    mx.array [rows, cols] in their stored dtype, block-quantized ones as QuantizedWeight.
    Every failure is a ModelLoadError naming the file and the problem."""
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(path, f"could not read the file ({exc})") from None
    try:
        meta, infos, data_start = _read_header(path, buf)
        _check_tensors(path, infos, data_start, len(buf))
        tensors = {
            name: _tensor(path, buf, name, dims, kind, data_start + offset)
            for name, dims, kind, offset in infos
        }
    finally:
        # a traceback may still hold a view of the map: then the collector closes it
        with contextlib.suppress(BufferError):
            buf.close()
    return meta, tensors


def _read_header(
    path: Path, buf: mmap.mmap
) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int]], int]:
    cur = _Cursor(buf)
    try:
        if buf[:4] != b"GGUF":
            raise ModelLoadError(path, "not a GGUF file (bad magic bytes)")
        cur.pos = 4
        version, num_tensors, num_keys = cur.take("IQQ")
        if version not in (2, 3) or max(num_tensors, num_keys) > _MAX_COUNT:
            raise ModelLoadError(path, f"unreadable GGUF header (version {version})")
        meta: dict[str, Any] = {}
        for _ in range(num_keys):
            key = cur.string()
            meta[key] = cur.value(cur.take("I"))
        infos = []
        for _ in range(num_tensors):
            name = cur.string()
            num_dims = cur.take("I")
            if num_dims > 4:
                raise ValueError(f"tensor {name} has {num_dims} dimensions")
            dims = tuple(int(d) for d in struct.unpack_from(f"<{num_dims}Q", buf, cur.pos))
            cur.pos += 8 * num_dims
            kind, offset = cur.take("IQ")
            infos.append((name, dims, kind, offset))
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(path, f"truncated or corrupt GGUF header ({exc})") from None
    alignment = meta.get("general.alignment")
    align = int(np.array(alignment)) if isinstance(alignment, mx.array) else 32
    if align <= 0:
        raise ModelLoadError(path, f"corrupt GGUF header (alignment {align})")
    return meta, infos, -(-cur.pos // align) * align


def _type_name(path: Path, name: str, kind: int) -> str:
    try:
        type_name = GGMLQuantizationType(kind).name
    except ValueError:
        raise ModelLoadError(path, f"tensor {name} has an unknown type (id {kind})") from None
    if type_name not in gguf_quants.SUPPORTED_TYPES:
        raise ModelLoadError(
            path,
            f"tensor {name} is {type_name}, which is not supported; supported: "
            f"{', '.join(gguf_quants.SUPPORTED_TYPES)}",
        )
    return type_name


def _nbytes(dims: tuple[int, ...], kind: int) -> int:
    per_block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    elements = int(np.prod(dims, dtype=np.int64)) if dims else 1
    return elements // per_block * block_bytes


def _check_tensors(
    path: Path, infos: list[tuple[str, tuple[int, ...], int, int]], data_start: int, size: int
) -> None:
    """Every tensor's type is one we read and its bytes lie inside the file."""
    for name, dims, kind, offset in infos:
        _type_name(path, name, kind)
        end = data_start + offset + _nbytes(dims, kind)
        if end > size:
            raise ModelLoadError(
                path,
                f"truncated: tensor {name} needs {end:,} bytes, the file has {size:,} "
                "(an incomplete download?)",
            )


def _tensor(
    path: Path, buf: mmap.mmap, name: str, dims: tuple[int, ...], kind: int, start: int
) -> Any:
    type_name = _type_name(path, name, kind)
    shape = tuple(reversed(dims))  # GGUF lists ne0 (the contiguous one) first
    if type_name in _DENSE:
        values = np.frombuffer(buf, _DENSE[type_name], int(np.prod(dims)), start)
        array = mx.array(values.reshape(shape))
        return array.view(mx.bfloat16) if type_name == "BF16" else array
    if len(dims) > 2:
        raise ModelLoadError(path, f"tensor {name}: quantized tensors of {len(dims)} dims")
    cols, rows = dims[0], dims[1] if len(dims) == 2 else 1
    kind_info = gguf_quants.block_type(type_name)
    data = np.frombuffer(buf, np.uint8, _nbytes(dims, kind), start)
    try:
        packed, scales, biases = gguf_quants.to_affine(data, type_name, rows, cols)
    except ValueError as exc:
        raise ModelLoadError(path, f"tensor {name}: {exc}") from None
    return QuantizedWeight(
        mx.array(packed),
        mx.array(scales),
        mx.array(biases),
        kind_info.group_size,
        kind_info.bits,
        source=type_name,
        fma_only=kind_info.fma_only,
    )
