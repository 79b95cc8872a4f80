"""The one-launch step's weights as stored: every matrix of a model in one table.

The step kernel (kernels/cuda/fused_step.cu) reads each weight where the loader left it
in MLX's affine layout: q of 2..8 bits packed into uint32 rows, one float32 scale s and
bias b per group of 16..128 elements, w = fma(s, q, b), the value GGUF's block gives, bit
for bit (kernels/gguf_quants.py). Dense matrices keep their float16, bfloat16 or float32.
No dense copy is made, so no weight is rounded to the compute dtype and a model of any
size fits as it is. Scales and biases travel as their uint32 bits (`scales`, `biases`):
they are only moved until the kernel reads them, so no copy can touch a value.

A matrix is up to PARTS row parts (`RowParts`: q|k|v quantized differently, as a Q4_K_M
file's attn_v often is). The kernel finds a row's part in `meta`:

    meta [matrices, PARTS, FIELDS] int64: first row, first word, first slot of `scales`,
    words a row, format (2..8: affine bits; F16, BF16, F32: dense; 64 or 128 + bits: a
    K-quant's factors), log2 group size, groups a row, first slot of `biases`

With `k_factors`, a K-quant part whose scales factor exactly (kernels/step_factors.py)
keeps a uint16 code a group in `scales` (two a float32 slot) and a float16 pair a
super-block in `biases` (one a slot) instead of a float32 scale and bias a group.

Matrices are numbered as the kernel takes them: layer l's qkv, o, gate_up and down are
4l .. 4l + 3, then the LM head (4L) and the embedding table (4L + 1; the head's entries
again when tied). Their words lie in that order (a layer's prefetch range runs from its
first word to the next layer's), each part on a 16-byte boundary, the table ending in
padding so that a slice's widest load stays inside.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from kernels import step_factors
from kernels.quantized import QuantizedWeight
from kernels.row_parts import RowParts
from kernels.step_knobs import TuningRefused

PARTS = 4  # a linear layer's in_proj: q|k|v, z, b, a
FIELDS = 8
F16, BF16, F32 = 16, 17, 32
AFFINE_BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (16, 32, 64, 128)
_DENSE = {mx.float16: F16, mx.bfloat16: BF16, mx.float32: F32}
_ALIGN_WORDS = 4
_PAD_WORDS = 8  # past the last row: a 3-, 5- or 6-bit slice reads up to 2 words beyond
_NO_ROW = 1 << 62  # an unused part's first row: no row reaches it


@dataclass(frozen=True)
class WeightTable:
    meta: mx.array  # int64 [matrices, PARTS, FIELDS]
    words: mx.array  # uint32
    scales: mx.array  # uint32: float32 bits (a K-quant's codes with FQ_KFACTORS)
    biases: mx.array  # uint32: float32 bits (its float16 pairs)
    formats: tuple[int, ...]  # the layers' format codes
    # the codes by role, as the kernel's dispatch builds them: every layer's qkv, o,
    # gate_up, down, then the LM head's and the embedding table's
    roles: tuple[tuple[int, ...], ...]
    layer_bytes: int  # the largest layer's words, scales and biases


@dataclass(frozen=True)
class _Part:
    rows: int
    fmt: int
    words: mx.array  # uint32 [rows, row_words]
    scales: mx.array | None  # float32 bits [rows, groups a row] as uint32; or codes, flat
    biases: mx.array | None  # ... ; or float16 pairs a super-block, flat
    shift: int


def part_unsupported(w: Any) -> str | None:
    """Why the table can't hold the matrix part `w` as stored, or None."""
    if isinstance(w, QuantizedWeight):
        rows, cols = w.shape
        if w.bits not in AFFINE_BITS:
            return f"{w.bits}-bit weights"
        if w.group_size not in GROUP_SIZES:
            return f"quantization groups of {w.group_size}"
        if cols % 32:
            return f"rows of {cols} weights (a multiple of 32 is needed)"
        return None
    dtype = getattr(w, "dtype", None)
    if dtype not in _DENSE:
        return f"a {type(w).__name__} weight of dtype {dtype}"
    if w.ndim != 2 or w.shape[1] % 8:
        return f"a dense weight of shape {tuple(w.shape)}"
    return None


def matrix_unsupported(w: Any) -> str | None:
    parts = list(w.parts) if isinstance(w, RowParts) else [w]
    if len(parts) > PARTS:
        return f"a matrix of {len(parts)} row parts (at most {PARTS})"
    for p in parts:
        reason = part_unsupported(p)
        if reason:
            return reason
    return None


def _part(w: Any, k_factors: bool) -> _Part:
    if isinstance(w, QuantizedWeight) and k_factors:
        scales, biases = (np.array(a.astype(mx.float32)) for a in (w.scales, w.biases))
        found = step_factors.factors(w.source, w.bits, scales, biases)
        if found is not None:
            fmt, codes, supers = found
            flat = codes.reshape(-1)
            if flat.size % 2:
                flat = np.concatenate([flat, np.zeros(1, dtype=np.uint16)])
            return _Part(
                rows=w.shape[0],
                fmt=fmt,
                words=w.packed,
                scales=mx.array(flat.view(np.uint32)),
                biases=mx.array(supers.reshape(-1).view(np.uint32)),
                shift=w.group_size.bit_length() - 1,
            )
    if isinstance(w, QuantizedWeight):
        return _Part(
            rows=w.shape[0],
            fmt=w.bits,
            words=w.packed,
            # float16 / bfloat16 scales widen exactly; carried as bits (moved, never computed)
            scales=w.scales.astype(mx.float32).view(mx.uint32),
            biases=w.biases.astype(mx.float32).view(mx.uint32),
            shift=w.group_size.bit_length() - 1,
        )
    return _Part(rows=int(w.shape[0]), fmt=_DENSE[w.dtype], words=w.view(mx.uint32), scales=None,
                 biases=None, shift=0)  # fmt: skip


def build(matrices: list[Any], single_part_from: int, k_factors: bool = False) -> WeightTable:
    """The table of `matrices` in kernel order (see the module text); the matrix at index
    `single_part_from` (the head) must be one part; the embedding table after it may be
    several (each row is found by its part: a block drafter's mask row after the target's
    embedding, engine/block_pass_fused.py)."""
    meta = [[[0] * FIELDS for _ in range(PARTS)] for _ in matrices]
    words: list[mx.array] = []
    scales: list[mx.array] = []
    biases: list[mx.array] = []
    n_words = n_groups = n_bias = 0  # words, slots of scales, slots of biases
    seen: dict[int, int] = {}
    starts: list[tuple[int, int, int]] = []
    for index, w in enumerate(matrices):
        reason = matrix_unsupported(w)
        if reason:
            raise ValueError(f"fused step weights: unsupported {reason}")
        if index >= single_part_from and id(w) in seen:  # a tied head and table: one copy
            meta[index] = [list(e) for e in meta[seen[id(w)]]]
            starts.append((n_words, n_groups, n_bias))
            continue
        seen[id(w)] = index
        parts = [_part(p, k_factors) for p in (w.parts if isinstance(w, RowParts) else [w])]
        if index == single_part_from and len(parts) > 1:  # the head reads its part 0 alone
            raise ValueError("fused step weights: the head must be one part")
        starts.append((n_words, n_groups, n_bias))
        row0 = 0
        for slot in range(PARTS):
            if slot >= len(parts):
                meta[index][slot][0] = _NO_ROW
                continue
            p = parts[slot]
            gap = -n_words % _ALIGN_WORDS
            if gap:
                words.append(mx.zeros((gap,), dtype=mx.uint32))
                n_words += gap
            row_words = int(p.words.shape[1])
            gpr = 0  # groups a row (codes and pairs are flat: from the words)
            if p.fmt >= step_factors.MIN_KIND:
                gpr = (row_words * 32 // (p.fmt & 15)) >> p.shift
            elif p.scales is not None:
                gpr = int(p.scales.shape[1])
            meta[index][slot] = [row0, n_words, n_groups, row_words, p.fmt, p.shift, gpr, n_bias]
            words.append(p.words.reshape(-1))
            n_words += p.rows * row_words
            if p.scales is not None and p.biases is not None:
                scales.append(p.scales.reshape(-1))
                biases.append(p.biases.reshape(-1))
                n_groups += int(p.scales.size)
                n_bias += int(p.biases.size)
            row0 += p.rows
    words.append(mx.zeros((_PAD_WORDS,), dtype=mx.uint32))
    scales.append(mx.zeros((1,), dtype=mx.uint32))  # never empty
    biases.append(mx.zeros((1,), dtype=mx.uint32))
    table = WeightTable(
        meta=mx.array(meta, dtype=mx.int64),
        words=mx.concatenate(words),
        scales=mx.concatenate(scales),
        biases=mx.concatenate(biases),
        formats=_formats(meta[:single_part_from]),
        roles=(
            *(_formats(meta[role:single_part_from:4]) for role in range(4)),
            _formats(meta[single_part_from:]),
        ),
        layer_bytes=_largest_layer(starts, single_part_from),
    )
    mx.eval(table.meta, table.words, table.scales, table.biases)
    return table


def _formats(meta: list[list[list[int]]]) -> tuple[int, ...]:
    return tuple(sorted({e[4] for m in meta for e in m if e[0] != _NO_ROW}))


def _largest_layer(starts: list[tuple[int, int, int]], layer_matrices: int) -> int:
    """Bytes of the largest layer (four matrices) between consecutive layer starts."""
    largest = 0
    for first in range(0, min(layer_matrices, len(starts) - 4), 4):
        begin, end = starts[first], starts[first + 4]
        largest = max(largest, 4 * sum(e - b for b, e in zip(begin, end, strict=True)))
    return largest


def model_matrices(model: Any) -> list[Any]:
    """A decoder's matrices in kernel order (a hybrid's linear layers: in_proj, out_proj),
    as the loader stored them where the backend kept that (kernels/ops_mlx.py's `stored`:
    float32 scales, groups of 16 still quantized), else as computed with."""
    stored = getattr(model.ops, "stored", lambda w: w)
    out: list[Any] = []
    for layer in model.layers:
        mixer = layer.mixer  # attention's q|k|v and o, or a linear layer's in_proj and out_proj
        first, second = (
            (mixer.in_proj, mixer.out_proj) if hasattr(mixer, "in_proj") else (mixer.qkv, mixer.o)
        )
        out += [first.w, second.w, layer.mlp.gate_up.w, layer.mlp.down.w]
    return [stored(w) for w in (*out, model.lm_head, model.embed)]


def build_for(model: Any, knobs: dict[str, int]) -> WeightTable:
    """The table of a full-attention decoder for a step built with `knobs` (FQ_KFACTORS:
    K-quant parts as their factors)."""
    matrices = model_matrices(model)
    return build(matrices, 4 * len(model.layers), k_factors=bool(knobs.get("FQ_KFACTORS")))


def check_wide(table: WeightTable) -> None:
    """FQ_WIDE reads 32 weights of a 4- or 8-bit row with one group's scale and bias (a
    6-bit row's two groups of 16 with two): TuningRefused where a 4- or 8-bit part's groups
    are smaller (the kernel would read them wrong)."""
    meta = np.array(table.meta)
    used = meta[..., 0] != _NO_ROW
    small = used & np.isin(meta[..., 4], (4, 8)) & (meta[..., 5] < 5)
    if small.any():
        mat, part = (int(i) for i in np.argwhere(small)[0])
        raise TuningRefused(
            f"FQ_WIDE: matrix {mat} has {int(meta[mat, part, 4])}-bit groups of "
            f"{1 << int(meta[mat, part, 5])} weights; it reads groups of 32 or more"
        )
