"""The target's GGUF read with NumPy alone: metadata, float32 tensors, the Llama config.

The GPU machine has numpy, torch and transformers but neither mlx nor the gguf package,
so engine/gguf_file.py (which needs both) cannot run there. This reader parses the same
layout (github.com/ggml-org/ggml/blob/master/docs/gguf.md) and dequantizes through
kernels.gguf_quants, the engine's own exact block conversion, so the float32 weights
are the ones the engine computes with, bit for bit.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kernels import gguf_quants

# ggml's type ids (ggml.h, enum ggml_type) for the types kernels.gguf_quants converts
_TYPE_NAMES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    15: "Q8_K",
    30: "BF16",
}
# GGUF metadata value types -> struct format of one scalar (8: string, 9: array)
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
CHECK_ROWS = 256  # the spec's target_check covers the embedding rows 0..255


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # [rows, cols]: GGUF's dims reversed, as NumPy reads them
    type_name: str
    offset: int  # absolute, in the file


class GGUFFile:
    """A mapped GGUF file: `meta` (plain Python values), `tensor(name)` as float32."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.meta, self.infos = _read_header(self._buf, self.path)

    def tensor(self, name: str) -> np.ndarray:
        info = self.infos[name]
        if info.type_name in ("F32", "F16", "BF16"):
            return _dense(self._buf, info)
        rows, cols = (1, info.shape[0]) if len(info.shape) == 1 else info.shape
        kind = gguf_quants.block_type(info.type_name)
        nbytes = rows * cols // kind.block_elements * kind.block_bytes
        data = np.frombuffer(self._buf, np.uint8, nbytes, info.offset)
        packed, scales, biases = gguf_quants.to_affine(data, info.type_name, rows, cols)
        w = gguf_quants.dequantize_affine(packed, scales, biases, kind.group_size, kind.bits)
        return w.reshape(info.shape)

    def arch_value(self, key: str, default: Any = None) -> Any:
        """A `{architecture}.{key}` metadata value (e.g. "rope.freq_base")."""
        return self.meta.get(f"{self.meta['general.architecture']}.{key}", default)


def _dense(buf: mmap.mmap, info: TensorInfo) -> np.ndarray:
    count = int(np.prod(info.shape))
    if info.type_name == "BF16":  # the top half of a float32
        raw = np.frombuffer(buf, "<u2", count, info.offset).astype(np.uint32) << 16
        return raw.view(np.float32).reshape(info.shape)
    dtype = "<f4" if info.type_name == "F32" else "<f2"
    return np.frombuffer(buf, dtype, count, info.offset).astype(np.float32).reshape(info.shape)


def _read_header(buf: mmap.mmap, path: Path) -> tuple[dict[str, Any], dict[str, TensorInfo]]:
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (bad magic bytes)")
    pos = 4

    def take(fmt: str) -> Any:
        nonlocal pos
        values = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string() -> str:
        nonlocal pos
        n = take("Q")
        text = buf[pos : pos + n].decode("utf-8")
        pos += n
        return text

    def value(kind: int) -> Any:
        if kind == _STRING:
            return string()
        if kind == _ARRAY:
            item_kind, n = take("IQ")
            return [value(item_kind) for _ in range(n)]
        if kind not in _SCALARS:
            raise ValueError(f"{path}: unknown metadata type {kind}")
        return take(_SCALARS[kind])

    version, num_tensors, num_keys = take("IQQ")
    if version not in (2, 3):
        raise ValueError(f"{path}: unreadable GGUF header (version {version})")
    meta = {}
    for _ in range(num_keys):
        key = string()
        meta[key] = value(take("I"))
    raw_infos = []
    for _ in range(num_tensors):
        name = string()
        dims = take(f"{take('I')}Q")
        dims = (dims,) if isinstance(dims, int) else dims
        kind, offset = take("IQ")
        if kind not in _TYPE_NAMES:
            raise ValueError(f"{path}: tensor {name} has type id {kind}, not supported here")
        raw_infos.append((name, tuple(reversed(dims)), _TYPE_NAMES[kind], offset))
    align = int(meta.get("general.alignment", 32))
    data_start = -(-pos // align) * align
    infos = {n: TensorInfo(n, s, t, data_start + o) for n, s, t, o in raw_infos}
    return meta, infos


def llama_config(gguf: GGUFFile) -> dict[str, Any]:
    """The target's shape and numerics from its metadata, named as transformers names them."""
    hidden = int(gguf.arch_value("embedding_length"))
    heads = int(gguf.arch_value("attention.head_count"))
    return {
        "vocab_size": int(
            gguf.arch_value("vocab_size", 0) or len(gguf.meta["tokenizer.ggml.tokens"])
        ),
        "hidden_size": hidden,
        "intermediate_size": int(gguf.arch_value("feed_forward_length")),
        "num_hidden_layers": int(gguf.arch_value("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(gguf.arch_value("attention.head_count_kv", heads)),
        "head_dim": int(gguf.arch_value("attention.key_length", 0) or hidden // heads),
        "rms_norm_eps": float(gguf.arch_value("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(gguf.arch_value("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(gguf.arch_value("context_length", 8192)),
        "tie_word_embeddings": "output.weight" not in gguf.infos,
        "bos_token_id": int(gguf.meta.get("tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(gguf.meta["tokenizer.ggml.eos_token_id"]),
    }


def embedding_check(embedding: np.ndarray) -> str:
    """The spec's target_check: sha256 of E[0:256] as float32 little-endian bytes."""
    rows = np.ascontiguousarray(embedding[:CHECK_ROWS], dtype="<f4")
    return hashlib.sha256(rows.tobytes()).hexdigest()
