"""What the one-launch step's source and signature say about a model's layers: each layer's
KV buffers or, in a hybrid (`Shapes.linear`), its Gated DeltaNet state, and the constants
of the gated attention and the linear layers (kernels/cuda/fused_step.cu, fused_step_gdn.cuh).

A hybrid's launch takes, beside the weight table and norms, the linear layers' conv
weights `gconvw` [G, C, K] and vectors `gvec` [G, 2 NV + DV] (-A, dt_bias, the gated
norm's weight), float32, and each layer's state: k{l}, v{l} for attention and, for the
linear layers stacked in layer order, `cstack` (conv windows [G, K - 1, C], the state's
dtype TC) and `sstack` (float32, the matrix states [NV, DK, DV] one after another; what
may follow is unread). It returns `gstate` (float32: every linear layer's new matrix
state, then its tape, `tape_layout`) and `gconv` (the new conv windows [G, K - 1, C],
TC): the next step's `sstack` and `cstack` as they are.
"""

from __future__ import annotations

import math

from kernels import gated_delta_cuda
from kernels.fused_shapes import ACTIVATIONS, Shapes

HYBRID_INPUTS = ["gconvw", "gvec"]
STACKS = ["cstack", "sstack"]


def is_linear(shapes: Shapes, layer: int) -> bool:
    return shapes.linear is not None and layer in shapes.linear.layers


def layer_source(shapes: Shapes, num_layers: int) -> str:
    """Lines for the body's start: the per-layer buffer arrays and the layers' constants."""
    s, g = shapes, shapes.linear
    layers = range(num_layers)
    attn = [i for i in layers if not is_linear(s, i)]
    keys = ", ".join("nullptr" if is_linear(s, i) else f"k{i}" for i in layers)
    values = ", ".join("nullptr" if is_linear(s, i) else f"v{i}" for i in layers)
    full = [i for i in attn if i not in s.sliding] or attn  # all sliding: cap is unread
    lines = [
        f"  const T* KEYS[L] = {{{keys}}};",
        f"  const T* VALUES[L] = {{{values}}};",
        f"  const int cap = k{full[0]}_shape[1];",
        f"  constexpr bool GATED = {'true' if s.attn_gate else 'false'};",
        f"  constexpr int RD = {s.rope_dims or s.head_dim};",
        *_gemma_lines(s),
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
    window, state = (g.conv_kernel - 1) * g.conv_channels, g.value_heads * g.key_dim * g.value_dim
    order = {layer: j for j, layer in enumerate(g.layers)}
    convs = ", ".join(f"cstack + {order[i] * window}" if i in order else "nullptr" for i in layers)
    ssms = ", ".join(f"sstack + {order[i] * state}" if i in order else "nullptr" for i in layers)
    go = _gbuf_row(s)
    lines += [
        "#define FS_HYBRID 1",
        *_layer_mask("FS_LINEAR", "LIN", g.layers),
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


def _layer_mask(macro: str, masks: str, layers: tuple[int, ...]) -> list[str]:
    """`macro`(l): whether layer l is one of `layers` (at most 128), from two 64-bit masks
    `masks`0 and `masks`1."""
    bits = [sum(1 << (i - 64 * w) for i in layers if 64 * w <= i < 64 * (w + 1)) for w in (0, 1)]
    m0, m1 = f"{masks}0", f"{masks}1"
    return [
        f"  constexpr unsigned long long {m0} = {bits[0]}ull, {m1} = {bits[1]}ull;",
        f"#define {macro}(l) ((l) < 64 ? ({m0} >> (l)) & 1ull : ({m1} >> ((l) - 64)) & 1ull)",
    ]


def _gemma_lines(s: Shapes) -> list[str]:
    """Sliding layers (their ring's size from the first one's buffer), sandwich norms, the
    MLP's activation, the embedding's and the attention's scales."""
    ring = f"k{s.sliding[0]}_shape[1]" if s.sliding else "1"  # 1: unread
    rope_stride = (s.rope_dims or s.head_dim) // 2 if s.rope_per_layer else 0
    return [
        *_layer_mask("FS_SLIDING", "SLD", s.sliding),
        # the KV row of position p: in a build without sliding layers, p as written
        "#define FS_KV_ROW(p) (slide ? (p) % ring : (p))"
        if s.sliding
        else "#define FS_KV_ROW(p) (p)",
        f"  const int ring = {ring};",
        f"  constexpr int WINDOW = {s.window};",
        f"  constexpr bool SANDWICH = {'true' if s.sandwich else 'false'};",
        f"  constexpr int ACT = {ACTIVATIONS.index(s.act)};",
        f"  constexpr float EMBED_SCALE = {float(s.embed_scale)!r}f;",
        f"  constexpr float ATTN_SCALE = {float(s.attn_scale)!r}f;  // 0: rsqrt(DH)",
        f"  constexpr int ROPE_STRIDE = {rope_stride};  // 0: one table for every layer",
    ]


def state_inputs(shapes: Shapes, num_layers: int) -> list[str]:
    """The layers' state inputs, in launch order: attention keys, attention values, then
    the linear layers' stacked conv windows and matrix states."""
    attn = [i for i in range(num_layers) if not is_linear(shapes, i)]
    out = [f"k{i}" for i in attn] + [f"v{i}" for i in attn]
    if shapes.linear is not None:
        out = HYBRID_INPUTS + out + STACKS
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
