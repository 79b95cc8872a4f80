"""Stand-in GGUF K-quant tensors for tests: gguf-py dequantizes Q2_K..Q6_K but cannot
quantize them, so random blocks (with small, valid float16 factors) play the stored
weights and the tests compare against what gguf-py decodes them to."""

from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType

# byte offsets of each type's float16 factors in a block, drawn small so weights stay ~0.02
K_QUANT_HALVES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
K_QUANT_SCALE = {"Q2_K": 2e-3, "Q3_K": 2e-4, "Q4_K": 3e-4, "Q5_K": 1.5e-4, "Q6_K": 1e-4}


def random_k_blocks(shape: tuple[int, ...], kind: str, seed: int) -> np.ndarray:
    """uint8 [rows, row bytes] of random `kind` blocks for a [rows, cols] weight."""
    rows, cols = shape
    block_elements, block_bytes = gguf.GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * cols // block_elements, block_bytes), dtype=np.uint8)
    for offset in K_QUANT_HALVES[kind]:
        d = (rng.standard_normal(blocks.shape[0]) * K_QUANT_SCALE[kind]).astype(np.float16)
        blocks[:, offset : offset + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def encode(w: np.ndarray, kind: str, seed: int) -> np.ndarray:
    """`w` as stored for GGUF type `kind`: gguf-py's quantization, or random K-quant blocks
    of its shape (the spec then holds what they decode to)."""
    if kind in K_QUANT_HALVES:
        return random_k_blocks(w.shape, kind, seed)
    return gguf.quants.quantize(w, GGMLQuantizationType[kind])
