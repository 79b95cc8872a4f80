"""What the one-launch step's source and signature say about a model's layers: each layer's
KV buffers or, in a hybrid (`Shapes.linear`), its Gated DeltaNet state, and the constants
of the gated attention and the linear layers (kernels/cuda/fused_step.cu, fused_step_gdn.cuh).

A hybrid's launch takes, beside the weight table and norms, the linear layers' conv
weights `gconvw` [G, C, K] and vectors `gvec` [G, 2 NV + DV] (-A, dt_bias, the gated
norm's weight), float32, and each layer's state: k{l}, v{l} for attention, c{l} (conv
window [K - 1, C], the state's dtype TC) and s{l} (float32 [NV, DK, DV]) for linear
layers. It returns `gstate` (float32: every linear layer's new matrix state, then its
tape, `tape_layout`) and `gconv` (the new conv windows [G, K - 1, C], TC).
"""

from __future__ import annotations

import math

from kernels import gated_delta_cuda
from kernels.fused_shapes import Shapes

HYBRID_INPUTS = ["gconvw", "gvec"]


def is_linear(shapes: Shapes, layer: int) -> bool:
    return shapes.linear is not None and layer in shapes.linear.layers


def layer_source(shapes: Shapes, num_layers: int) -> str:
    """Lines for the body's start: the per-layer buffer arrays and the layers' constants."""
    s, g = shapes, shapes.linear
    layers = range(num_layers)
    attn = [i for i in layers if not is_linear(s, i)]
    keys = ", ".join("nullptr" if is_linear(s, i) else f"k{i}" for i in layers)
    values = ", ".join("nullptr" if is_linear(s, i) else f"v{i}" for i in layers)
    lines = [
        f"  const T* KEYS[L] = {{{keys}}};",
        f"  const T* VALUES[L] = {{{values}}};",
        f"  const int cap = k{attn[0]}_shape[1];",
        f"  constexpr bool GATED = {'true' if s.attn_gate else 'false'};",
        f"  constexpr int RD = {s.rope_dims or s.head_dim};",
    ]
    if g is None:
        return "\n".join(
            lines
            + [
                "#define FS_HYBRID 0",
                "#define FS_LINEAR(l) false",
                "  constexpr int GDN_NIN = 0, GDN_GO = 0;",
            ]
        )
    masks = [sum(1 << (i - 64 * w) for i in g.layers if 64 * w <= i < 64 * (w + 1)) for w in (0, 1)]
    convs = ", ".join(f"c{i}" if is_linear(s, i) else "nullptr" for i in layers)
    ssms = ", ".join(f"s{i}" if is_linear(s, i) else "nullptr" for i in layers)
    go = _gbuf_row(s)
    lines += [
        "#define FS_HYBRID 1",
        f"  constexpr unsigned long long LIN0 = {masks[0]}ull, LIN1 = {masks[1]}ull;",
        "#define FS_LINEAR(l) ((l) < 64 ? (LIN0 >> (l)) & 1ull : (LIN1 >> ((l) - 64)) & 1ull)",
        "#define FS_LINEAR_INDEX(l) ((l) < 64 ? __popcll(LIN0 & ((1ull << (l)) - 1ull)) "
        ": __popcll(LIN0) + __popcll(LIN1 & ((1ull << ((l) - 64)) - 1ull)))",
        f"  constexpr int GDN_NK = {g.key_heads}, GDN_NV = {g.value_heads};",
        f"  constexpr int GDN_DK = {g.key_dim}, GDN_DV = {g.value_dim};",
        f"  constexpr int GDN_CONVK = {g.conv_kernel}, GDN_LAYERS = {len(g.layers)};",
        f"  constexpr bool GDN_TILED = {'true' if g.tiled else 'false'};",
        f"  constexpr int GDN_NIN = {g.in_rows}, GDN_GO = {go};",
        f"  constexpr int GDN_PAIR = {gated_delta_cuda.PAIR};  // as the replay kernel's",
        f"  constexpr float GDN_QSCALE = {float(1 / math.sqrt(g.key_dim))!r}f;",
        f"  const TC* CONVS[L] = {{{convs}}};",
        f"  const float* SSMS[L] = {{{ssms}}};",
    ]
    return "\n".join(lines)


def state_inputs(shapes: Shapes, num_layers: int) -> list[str]:
    """The layers' state inputs, in launch order: attention keys, attention values, then
    the linear layers' conv windows and matrix states."""
    attn = [i for i in range(num_layers) if not is_linear(shapes, i)]
    lin = [i for i in range(num_layers) if is_linear(shapes, i)]
    out = [f"k{i}" for i in attn] + [f"v{i}" for i in attn]
    if shapes.linear is not None:
        out = HYBRID_INPUTS + out + [f"c{i}" for i in lin] + [f"s{i}" for i in lin]
    return out


def state_floats(shapes: Shapes) -> int:
    """float32 elements of every linear layer's matrix state (gstate's first part)."""
    g = shapes.linear
    if g is None:
        return 0
    return len(g.layers) * g.value_heads * g.key_dim * g.value_dim


def gstate_floats(shapes: Shapes, rows: int) -> int:
    """gstate's float32 elements for a call of `rows`: the states, then each linear layer's
    tape [rows, tape_row] in layer order."""
    g = shapes.linear
    assert g is not None
    return state_floats(shapes) + len(g.layers) * rows * g.tape_row()


def tape_layout(shapes: Shapes) -> list[tuple[str, int]]:
    """(name, floats) of a tape row's pieces, in order."""
    g = shapes.linear
    assert g is not None
    nv = g.value_heads
    return [
        ("q", nv * g.key_dim),
        ("k", nv * g.key_dim),
        ("v", nv * g.value_dim),
        ("g", nv),
        ("beta", nv),
        ("conv_in", g.conv_channels),
    ]


def scratch_floats(shapes: Shapes, max_rows: int) -> int:
    """The scratch a hybrid adds before the attention partials: in_proj rows and the gate
    or normed output buffer (fused_step.cu's `mix`, `gbuf`)."""
    g = shapes.linear
    if g is None:
        return 0
    return max_rows * (g.in_rows + _gbuf_row(shapes))


def _gbuf_row(shapes: Shapes) -> int:
    """floats a row of `gbuf`: a linear layer's normed output or the attention's gate."""
    g = shapes.linear
    assert g is not None
    return max(g.value_heads * g.value_dim, shapes.heads * shapes.head_dim)
