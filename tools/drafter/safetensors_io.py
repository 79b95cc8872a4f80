"""The drafter file's bytes without torch or the safetensors package: read, and write with
sorted keys (one checkpoint, one sha256), so the engine's side (stamp.py) and training's
(export.py) share them."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

# safetensors' dtype names (github.com/huggingface/safetensors, the format's README)
_DTYPES = {"float16": "F16", "float32": "F32", "int32": "I32"}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """The safetensors layout (u64 header size, JSON header, raw little-endian data),
    written here with sorted keys so one checkpoint always gives the same bytes and sha256
    (the safetensors package orders the metadata as its hash map does)."""
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        header[name] = {"dtype": _DTYPES[t.dtype.name], "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.nbytes]}  # fmt: skip
        offset += t.nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name in sorted(tensors):
            f.write(
                np.ascontiguousarray(tensors[name])
                .astype(tensors[name].dtype.newbyteorder("<"))
                .tobytes()
            )


def read_drafter_file(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, metadata) of a drafter file, as stored (read-only views of its bytes)."""
    raw = Path(path).read_bytes()
    (size,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8 : 8 + size])
    metadata = header.pop("__metadata__", {})
    names = {v: k for k, v in _DTYPES.items()}
    tensors = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        dtype = np.dtype(names[info["dtype"]]).newbyteorder("<")
        data = np.frombuffer(raw, dtype, (end - start) // dtype.itemsize, 8 + size + start)
        tensors[name] = data.reshape(info["shape"])
    return tensors, metadata
