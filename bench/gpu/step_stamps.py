"""The probe's build of the one-launch step kernel: the engine's kernel body, unchanged,
with cycle stamps at its grid barriers (step_stamps.cuh). The engine never builds this:
its kernel (kernels/cuda/fused_step.cu) holds no profiling code.

The header renames the engine's barrier to fs_grid_sync_unstamped and step_stamps.cuh
defines fs_grid_sync around it; the body gains a first and a last statement.
"""

from __future__ import annotations

from pathlib import Path

from kernels import cuda, fused_decode_cuda, fused_step_cuda
from kernels.fused_shapes import Shapes

STAMPED_HEADER = (
    fused_decode_cuda.header()
    + "#define fs_grid_sync fs_grid_sync_unstamped\n"
    + cuda.source("fused_step.cuh")
    + "#undef fs_grid_sync\n"
    + (Path(__file__).parent / "step_stamps.cuh").read_text(encoding="utf-8")
)


def stamped_source(shapes: Shapes, num_layers: int) -> str:
    body = fused_step_cuda.step_source(shapes, num_layers)
    return "  fs_stamps_begin(stamps);\n" + body + "  fs_stamps_end(L);\n"


def num_stamps(num_layers: int, blocks: int) -> int:
    """A row of block 0's interval and every block's work per barrier and the head, then
    the launch's ns and cycles (the layout step_stamps.cuh writes)."""
    return (5 * num_layers + 2) * (blocks + 1) + 2


class StampedStepKernel(fused_step_cuda.StepKernel):
    """The engine's step kernel built with cycle stamps; `launch` returns them last."""

    name = "fs_step_stamped"

    def __init__(self, shapes: Shapes, num_layers: int, *args: object, **kwargs: object) -> None:
        if shapes.qk_norm:  # num_stamps counts five barriers a layer
            raise ValueError("the stamped step has no layout for q/k norm's sixth barrier")
        super().__init__(shapes, num_layers, *args, **kwargs)  # type: ignore[arg-type]

    def header(self, verify: bool = False) -> str:
        knobs = fused_step_cuda.formats_header(self.formats, self.tuning, verify, self.roles)
        return knobs + STAMPED_HEADER

    def source(self) -> str:
        return stamped_source(self.s, self.L)

    def outputs(self, rows: int) -> list[tuple[str, tuple[int, ...]]]:
        return [*super().outputs(rows), ("stamps", (num_stamps(self.L, self.blocks),))]
