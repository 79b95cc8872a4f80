"""What the nucleus pack kernel refuses (kernels/nucleus_pack_cuda.py), checked before any
launch, so on every machine: a pack as wide as the row or wider than a block's threads,
rows not in float32, and token ids a float32 pack cannot hold exactly."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kernels import nucleus_pack_cuda


@pytest.mark.parametrize(
    "rows,k,message",
    [
        (mx.zeros((1, 256)), 256, "0 < k < V"),
        (mx.zeros((1, 300)), 0, "0 < k < V"),
        (mx.zeros((1, 4096)), 2048, "k <= 1024"),  # a thread a candidate
        (mx.zeros((1, 300), dtype=mx.bfloat16), 256, "float32 rows"),
        (mx.zeros((1, 1 << 24)), 256, "past 2\\^24"),  # lazy: never allocated
    ],
)
def test_a_pack_the_kernel_cannot_make_is_refused(rows: mx.array, k: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        nucleus_pack_cuda.pack_and_draw(rows, k, 0.7, 0.95, 0.5)
