"""The probe's build of the one-launch step kernel: the engine's kernel body, unchanged,
with cycle stamps at its grid barriers (step_stamps.cuh). The engine never builds this:
its kernel (kernels/cuda/fused_step.cu) holds no profiling code.

The header renames the engine's barrier to fs_grid_sync_unstamped and step_stamps.cuh
defines fs_grid_sync around it; the body gains a first and a last statement. Which phase
each barrier ends follows the kernel's layer kinds (`phases`): a full-attention layer's
A (qkv), A2 (q/k norm), B (attention), C (o_proj), C2 (a sandwich norm), D (gate/up), E
(down), E2 (a sandwich norm); a Gated DeltaNet layer's G1 (in_proj), G2 (conv and
recurrence), G3 (out_proj), D, E.
"""

from __future__ import annotations

from pathlib import Path

from kernels import cuda, fused_decode_cuda, fused_step_cuda, fused_step_layers
from kernels.fused_shapes import Shapes

STAMPED_HEADER = (
    fused_decode_cuda.header()
    + cuda.source("gated_delta_row.cuh")
    + "#define fs_grid_sync fs_grid_sync_unstamped\n"
    + cuda.source("fused_step.cuh")
    + "#undef fs_grid_sync\n"
    + cuda.source("fused_step_gdn.cuh")
    + (Path(__file__).parent / "step_stamps.cuh").read_text(encoding="utf-8")
)


def layer_phases(shapes: Shapes, layer: int) -> list[str]:
    """The phases of `layer` in barrier order (each ends at a grid barrier)."""
    if fused_step_layers.is_linear(shapes, layer):
        return ["G1_in_proj", "G2_recurrence", "G3_out_proj", "D_gate_up", "E_down"]
    norm = ["A2_qk_norm"] if shapes.qk_norm else []
    after_attention = ["C2_post_norm"] if shapes.sandwich else []
    after_mlp = ["E2_post_norm"] if shapes.sandwich else []
    return [
        "A_qkv", *norm, "B_attention", "C_o_proj", *after_attention, "D_gate_up", "E_down",
        *after_mlp,
    ]  # fmt: skip


def phases(shapes: Shapes, num_layers: int) -> list[tuple[int, str]]:
    """(layer, phase) of each stamp row: the embedding (layer -1), every layer's phases,
    the head (layer num_layers)."""
    rows = [(-1, "embed")]
    for layer in range(num_layers):
        rows += [(layer, name) for name in layer_phases(shapes, layer)]
    return [*rows, (num_layers, "head")]


def stamped_source(shapes: Shapes, num_layers: int) -> str:
    body = fused_step_cuda.step_source(shapes, num_layers)
    slots = len(phases(shapes, num_layers))
    return "  fs_stamps_begin(stamps);\n" + body + f"  fs_stamps_end({slots});\n"


def num_stamps(slots: int, blocks: int) -> int:
    """A row of block 0's interval and every block's work per barrier and the head, then
    the launch's ns and cycles (the layout step_stamps.cuh writes)."""
    return slots * (blocks + 1) + 2


class StampedStepKernel(fused_step_cuda.StepKernel):
    """The engine's step kernel built with cycle stamps; `launch` returns them last."""

    name = "fs_step_stamped"

    def header(self, verify: bool = False) -> str:
        knobs = fused_step_cuda.formats_header(self.formats, self.tuning, verify, self.roles)
        return knobs + STAMPED_HEADER

    def source(self) -> str:
        return stamped_source(self.s, self.L)

    def outputs(self, rows: int, calls_rows: int = 1) -> list[tuple[str, tuple[int, ...]]]:
        slots = len(phases(self.s, self.L))
        blocks = max(self.blocks, self.verify_blocks)  # a verify's launch may take its own
        return [*super().outputs(rows, calls_rows), ("stamps", (num_stamps(slots, blocks),))]
