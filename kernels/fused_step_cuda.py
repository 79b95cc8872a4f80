"""A whole decode/verify step of a decoder as ONE CUDA kernel launch (full attention;
Gemma 3's sliding rings and sandwich norms; a hybrid's Gated DeltaNet layers).

The five-kernels-a-layer path (`kernels.fused_decode_cuda`) is bound by MLX's per-node
host cost on CUDA (~11 us a node on the H200: ~210 nodes, ~2.4 ms a step). This kernel
runs every layer's five phases (qkv + RoPE + KV write, attention, o_proj + residual,
norm + gate/up + SiLU, down + residual) and the LM head in one launch, with a grid-wide
barrier between phases: one block per SM (or FQ_BLOCKS), all resident, phases split
across blocks.

A phase is a short chain of memory latencies, so it is written for latency: a warp
issues every weight and activation load it needs before using any (`FsRows`,
`fs_dot_group`), takes the RMS norm from the activations its dot product loaded anyway,
and the next layer's weights are fetched into L2 while this one runs. Attention splits a
(row, head) over a block's warps (CK keys each, combined in shared memory) and, past
8 * CK keys, over blocks, whose partials the block that finishes last combines in chunk
order. `bench/gpu/step_probe.py` times each phase in a build of its own, which adds cycle
stamps at the barriers (bench/gpu/step_stamps.cuh); the engine's build has no such code.

The weights are read as stored, from one table of every matrix (kernels/step_weights.py):
4-bit blocks as 4-bit words and their float32 scales, no dense copy, so no rounding to the
compute dtype and no size limit. Every row is computed with the same operations in the
same order whatever the row count (the dot products pin their rounding with intrinsics;
the attention split depends only on the row's own key count): a verify's logits, from the
build for up to MAX_ROWS rows, equal the one-row build's steps bit for bit, which keeps
greedy speculation exact. The five kernels round differently (they read a dense copy);
only one path is in use at a time.

Memory rules inside the launch: activations, partials and KV rows written by one block
are read by others after a barrier or a fenced counter, so those reads bypass L1
(`__ldcg`); weights are read-only. The kernel writes three inputs: the new KV rows go
straight into the state's buffers (`engine/runner/fused.py` keeps each contiguous and
unshared) and the scratch buffer (activations, attention partials) is kept by
`StepKernel` between launches, every element written before it is read. A barrier that
waits too long (blocks not co-resident: a smaller GPU shared with other work) sets an
error flag instead of hanging; the caller then falls back to the five kernels.
"""

from __future__ import annotations

import hashlib
from functools import cache
from typing import Any

import mlx.core as mx

from kernels import cuda, fused_step_layers
from kernels.fused_decode_cuda import MAX_ROWS, constants, header
from kernels.fused_shapes import Shapes
from kernels.step_knobs import (
    ROLES,
    SMEM_X_BYTES_PER_SM,
    THREADS,
    TUNING,
    TWO_BLOCKS_LAYER_BYTES,
    blocks_per_sm,
    check_int8,
    check_tuning,
    formats_header,
    smem_x,
    tuning_for,
)
from kernels.step_weights import WeightTable

__all__ = [
    "ROLES",
    "SMEM_X_BYTES_PER_SM",
    "TUNING",
    "TWO_BLOCKS_LAYER_BYTES",
    "StepKernel",
    "check_tuning",
    "formats_header",
    "tuning_for",
]

_PRIVATE_PAGE_FLOATS = 1 << 14  # 64 KiB: large enough for an allocation of its own
# The uint32 outputs after the logits: barrier counters and flags (a page of their own: see
# fused_step.cu), then the status the host reads.
_BUFFERS: list[tuple[str, tuple[int, ...]]] = [
    ("sync_buf", (_PRIVATE_PAGE_FLOATS,)),
    ("status", (1,)),
]

STEP_HEADER = (  # kernels/cuda/
    header()
    + cuda.source("gated_delta_row.cuh")
    + cuda.source("fused_step.cuh")
    + cuda.source("fused_step_gdn.cuh")
)
_BODY = cuda.source("fused_step.cu")
_SM_COUNT = cuda.source("sm_count.cu")

_WEIGHTS = ["meta", "words", "scales", "biases"]  # a WeightTable's arrays
# float32 [L, D], [L, D], [D]; [RD / 2] (every layer's rotation) or, with
# Shapes.rope_per_layer, [L, RD / 2]; [L, DH] twice (one element each without q/k norm);
# [L, D] twice (sandwich norms; one element each without)
_NORMS = ["nw1", "nw2", "nwf", "freqs", "qnorm", "knorm", "pn1", "pn2"]
# a layer's weights up to this size are fetched into L2 while the layer before runs
PREFETCH_LAYER_BYTES = 16 << 20


def step_source(shapes: Shapes, num_layers: int) -> str:
    qk_norm = "true" if shapes.qk_norm else "false"
    lines = [constants(shapes, L=num_layers, THREADS=THREADS, QK_NORM=qk_norm)]
    lines.append(fused_step_layers.layer_source(shapes, num_layers))
    return "\n".join(lines) + "\n" + _BODY


def input_names(num_layers: int, shapes: Shapes | None = None) -> list[str]:
    """The launch's inputs; the layers' states as `shapes` lays them out (a hybrid's linear
    layers: kernels/fused_step_layers.py), without it every layer's keys and values."""
    if shapes is None:
        caches = [f"k{i}" for i in range(num_layers)] + [f"v{i}" for i in range(num_layers)]
    else:
        caches = fused_step_layers.state_inputs(shapes, num_layers)
    return ["ids", "pos", "scratch", *_WEIGHTS, *_NORMS, *caches]


def output_names() -> list[str]:
    return ["logits", *(name for name, _ in _BUFFERS)]


def chunk_keys(head_dim: int, itemsize: int) -> int:
    """Keys one warp's attention item takes: as many as keep its K and V loads within
    ~32 registers each (32 for head_dim 64 in bfloat16). 64 keys (64 registers each)
    spilled once the weight table's dot products shared the kernel's registers."""
    lanes_per_key = head_dim // 8
    keys_per_load = 32 // lanes_per_key
    value_dims = max(1, head_dim // 32)
    value_regs = max(1, value_dims * itemsize // 4)
    return min(128 // (8 * itemsize) * keys_per_load, 32 // value_regs)


def hidden_offset(shapes: Shapes) -> int:
    """Where the residual rows [MAX_ROWS, D] lie in the scratch (after qs, ao: [MAX_ROWS,
    heads * head_dim] each; hs [MAX_ROWS, D]; act [MAX_ROWS, F]: fused_step.cu's layout).
    After a step they hold the last layer's output, which the head normalises."""
    s = shapes
    return MAX_ROWS * (2 * s.heads * s.head_dim + s.hidden + s.intermediate)


def scratch_size(shapes: Shapes, capacity: int, itemsize: int) -> int:
    """float32 elements of the step's scratch: activations (a hybrid's in_proj rows and
    gate among them, and FQ_INT8_ONCE's int8 rows), then attention partials."""
    s = shapes
    HD = s.heads * s.head_dim
    chunks = -(-capacity // (8 * chunk_keys(s.head_dim, itemsize)))  # a block's 8 warps
    activations = MAX_ROWS * (2 * HD + 2 * s.hidden + s.intermediate)
    activations += fused_step_layers.scratch_floats(s, MAX_ROWS) + int8_once_floats(s)
    partials = MAX_ROWS * s.heads * chunks * (s.head_dim + 2)
    return max(activations + partials, _PRIVATE_PAGE_FLOATS)


def int8_once_floats(shapes: Shapes) -> int:
    """float32 elements of FQ_INT8_ONCE's int8 x before the attention partials (fused_step.cu's
    oq8, od8, aq8, ad8): the attention output's and the activation's rows, a byte an
    element and a float32 scale a block of 32."""
    HD, F = shapes.heads * shapes.head_dim, shapes.intermediate
    return MAX_ROWS * ((HD + F) // 4 + HD // 32 + F // 32)


@cache
def sm_count() -> int:
    """Streaming multiprocessors on the current GPU (read from %nsmid in a kernel)."""
    kernel: Any = mx.fast.cuda_kernel(
        name="fs_sm_count", input_names=["dummy"], output_names=["out"], source=_SM_COUNT
    )
    (out,) = kernel(
        inputs=[mx.zeros((1,), dtype=mx.int32)],
        grid=(32, 1, 1),
        threadgroup=(32, 1, 1),
        output_shapes=[(1,)],
        output_dtypes=[mx.int32],
    )
    return int(out.item())


class StepKernel:
    """One launch per step for a model of `num_layers` layers with these shapes.

    `header`, `source` and `outputs` say what is compiled; a build with extra outputs
    (bench/gpu/step_stamps.py's cycle stamps) overrides them and reads them from `launch`.
    """

    name = "fs_step"

    def __init__(
        self,
        shapes: Shapes,
        num_layers: int,
        formats: tuple[int, ...],
        prefetch: bool = True,
        tuning: dict[str, int] | None = None,
        roles: tuple[tuple[int, ...], ...] | None = None,
    ) -> None:
        reason = shapes.check() or step_unsupported(shapes)
        if reason:
            raise ValueError(f"fused step kernel: unsupported {reason}")
        self.s, self.L = shapes, num_layers
        self.formats, self.roles = formats, roles
        self.prefetch = prefetch
        self.tuning = TUNING | (tuning or {})
        check_int8(_row_lengths(shapes, bool(self.tuning["FQ_INT8_RESIDUAL"])), self.tuning)
        # named by everything the builds are made of: MLX keeps a compiled kernel by its name
        key = f"{shapes!r}/{num_layers}/{formats}/{roles}/{sorted(self.tuning.items())}"
        key += self.source() + self.header(False) + self.header(True)
        tag = hashlib.sha1(key.encode()).hexdigest()[:10]
        # blocks of the decode build and of the verify build, all resident at once
        self.blocks = sm_count() * blocks_per_sm(self.tuning, verify=False)
        self.verify_blocks = sm_count() * blocks_per_sm(self.tuning, verify=True)
        self._scratch: mx.array | None = None
        self._kernels: dict[bool, Any] = {  # by verify: each build its own launch bounds
            verify: mx.fast.cuda_kernel(
                name=f"{self.name}_{tag}_{'v' if verify else 'd'}",
                input_names=input_names(num_layers, shapes),
                output_names=[name for name, _ in self.outputs(1)],
                source=self.source(),
                header=self.header(verify),
                shared_memory=4 * smem_x(self.tuning, verify),  # the staged x (fq_stage)
            )
            for verify in (False, True)
        }

    @classmethod
    def for_table(cls, shapes: Shapes, num_layers: int, table: WeightTable, tuning: Any) -> Any:
        """The step for `table`'s formats, by role, with `tuning`."""
        return cls(shapes, num_layers, table.formats, True, tuning, table.roles)

    def header(self, verify: bool = False) -> str:
        return formats_header(self.formats, self.tuning, verify, self.roles) + STEP_HEADER

    def source(self) -> str:
        return step_source(self.s, self.L)

    def outputs(self, rows: int, calls_rows: int = 1) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of each output: logits [rows, V] f32, then uint32 buffers; a
        hybrid's gstate and gconv (kernels/fused_step_layers.py) for a call of `calls_rows`."""
        out = [("logits", (rows, self.s.vocab)), *_BUFFERS]
        g = self.s.linear
        if g is not None:
            gstate = fused_step_layers.gstate_floats(self.s, calls_rows)
            out += [
                ("gstate", (gstate,)),
                ("gconv", (len(g.layers), g.conv_kernel - 1, g.conv_channels)),
            ]
        return out

    def scratch(self, capacity: int, dtype: mx.Dtype) -> mx.array:
        """The step's scratch buffer (kept: the kernel writes every element it reads)."""
        need = scratch_size(self.s, capacity, dtype.size)
        if self._scratch is None or self._scratch.size < need:
            self._scratch = mx.zeros((need,), dtype=mx.float32)
            mx.eval(self._scratch)
        return self._scratch

    def __call__(
        self,
        ids: mx.array,
        pos: mx.array,
        weights: WeightTable,
        norms: list[mx.array],
        keys: list[mx.array],
        values: list[mx.array],
        head_mode: int,
        prefetch: bool | None = None,
        linear: Any = None,
    ) -> tuple[mx.array, mx.array]:
        """(logits [rows, V] f32, status [1] u32: nonzero if a barrier timed out).
        norms: nw1, nw2 [L, D], nwf [D], the inverse frequencies [RD / 2] (with
        Shapes.rope_per_layer [L, RD / 2]), q_norm and k_norm [L, DH], the norms after
        attention and MLP [L, D], float32. head_mode: 0 no logits, 1 the last row's, 2
        every row's. keys, values: the attention layers'; a hybrid's `linear`: ([gconvw,
        gvec], cstack, sstack) of its linear layers (kernels/fused_step_layers.py; then see
        `launch`)."""
        outs = self.launch(ids, pos, weights, norms, keys, values, head_mode, prefetch, linear)
        return outs[0], outs[2]

    def launch(
        self,
        ids: mx.array,
        pos: mx.array,
        weights: WeightTable,
        norms: list[mx.array],
        keys: list[mx.array],
        values: list[mx.array],
        head_mode: int,
        prefetch: bool | None = None,
        linear: Any = None,
    ) -> list[mx.array]:
        """Every output of one launch, in `outputs` order."""
        s = self.s
        M = ids.shape[0]
        if not 1 <= M <= MAX_ROWS:
            raise ValueError(f"a fused step takes 1..{MAX_ROWS} rows, not {M}")
        if not set(weights.formats) <= set(self.formats):
            raise ValueError(f"weights of formats {weights.formats}, built for {self.formats}")
        rows = {0: 1, 1: 1, 2: M}[head_mode]
        dtype = keys[0].dtype
        scratch = self.scratch(max(k.shape[1] for k in keys), dtype)  # caches and rings
        shapes = [shape for _, shape in self.outputs(rows, M)]
        caches = [*keys, *values]
        out_dtypes = [mx.float32] + [mx.uint32] * len(_BUFFERS)
        template: list[tuple[str, Any]] = [("T", dtype)]
        if (linear is None) != (s.linear is None):
            raise ValueError("a hybrid's step takes its linear layers' states, and only it")
        if linear is not None:
            params, cstack, sstack = linear
            caches = [*params, *caches, cstack, sstack]
            conv_dtype = cstack.dtype
            out_dtypes += [mx.float32, conv_dtype]
            template.append(("TC", conv_dtype))
        if prefetch is None:
            prefetch = self.prefetch and weights.layer_bytes <= PREFETCH_LAYER_BYTES
        tables = [weights.meta, weights.words, weights.scales, weights.biases]
        verify = M > 1
        blocks = self.verify_blocks if verify else self.blocks
        outs: list[mx.array] = self._kernels[verify](
            inputs=[ids, pos, scratch, *tables, *norms, *caches],
            template=[
                *template,
                ("HEAD_MODE", head_mode),
                ("CK", chunk_keys(s.head_dim, dtype.size)),
                ("PREFETCH", int(prefetch)),
                ("MAXM", MAX_ROWS if verify else 1),  # decode's own build: fewer registers
            ],
            grid=(blocks * THREADS, 1, 1),
            threadgroup=(THREADS, 1, 1),
            output_shapes=shapes,
            output_dtypes=out_dtypes + [mx.uint32] * (len(shapes) - len(out_dtypes)),
            init_value=0,
        )
        return outs


def _row_lengths(shapes: Shapes, residual: bool = True) -> tuple[int, ...]:
    """The lengths of the rows of x the step's phases stage in int8: the hidden size (the
    normed phases'), and where `residual` (FQ_INT8_RESIDUAL) the residual phases' too: the
    attention and MLP widths, and a hybrid's value width (its out_proj's input)."""
    if not residual:
        return (shapes.hidden,)
    rows = (shapes.hidden, shapes.heads * shapes.head_dim, shapes.intermediate)
    g = shapes.linear
    return rows + ((g.value_heads * g.value_dim,) if g is not None else ())


def step_unsupported(shapes: Shapes) -> str | None:
    """Why the one-launch kernel can't take these shapes (the five kernels may), or None."""
    if shapes.head_dim not in (8, 16, 32, 64, 128, 256):
        return f"head_dim {shapes.head_dim} (the one-launch attention needs a power of two)"
    return None
