"""The one-launch step's build knobs (kernels/cuda/fused_step.cuh, fused_step.cu): their
engine values for a model's layer size, their check (BRANCHCHAT_STEP_TUNING is checked at
load, on any machine), and the header lines a build starts with: the format lists its
dispatch is compiled for, by role (kernels/step_weights.py's WeightTable.roles), the
knobs, and the launch bounds of a build of more than one block an SM.
"""

from __future__ import annotations

THREADS = 256  # a block's threads (fused_step_cuda.StepKernel launches this many)


class TuningRefused(ValueError):
    """A build knob the model's shapes or weight table cannot take (FQ_INT8's passes,
    FQ_WIDE's groups): the engine refuses to load rather than fall back to the plain path."""


# The build knobs (kernels/cuda/fused_step.cuh, fused_step.cu) and the engine's values:
# slices of words a warp loads at once, whether it decodes them as used, rows of x a
# verify's pass takes, blocks an SM (more warps to keep loads in flight, in half the
# registers each; the verify's build may differ), floats of a phase's x a block copies
# into shared memory (0: x is read from L2 by every warp). Every choice gives a row the
# same bits.
TUNING = {
    "FQ_SLICES": 8,
    "FQ_STREAM": 0,
    "FQ_VERIFY_ROWS": 2,
    "FQ_BLOCKS": 1,
    "FQ_SMEM_X": 8192,
    "FQ_VERIFY_BLOCKS": 0,  # blocks an SM of the verify build; 0: FQ_BLOCKS
    "FQ_BARRIER": 0,  # the grid barrier: 0 full fences, 1 release add and acquire loads
    "FQ_L1_PREFETCH": 0,  # 1: a warp's first row of the next phase into L1 before a barrier
    # 1: K-quant parts as their factors, 2.5 bytes a group for 8 (kernels/step_factors.py;
    # the table's layout, which `engine/runner/fused.py` builds by it; the same bits)
    "FQ_KFACTORS": 0,
    # 1: a verify's groups of FQ_VERIFY_ROWS rows dealt to the warps as units of their own
    # (fused_step.cuh's FqUnits), where a phase has fewer outputs than the grid has warps:
    # on an H100, the default model's 16-row verify 3.12 -> 2.74 ms, 8 rows 1.78 -> 1.73,
    # a step unchanged, the same bits (docs/BENCHMARKS.md, session 25)
    "FQ_SPREAD": 1,
    # rows a pass of a verify's LM head (0: FQ_VERIFY_ROWS). The head's table is the largest
    # (the Qwen3.5 shape's 248k rows of Q6_K, ~318 MB: past L2), each pass reads it again: on
    # an H100 an 8-row verify's head took 726 us at 2 rows a pass, a step's 182
    # (docs/h100/step-probe-hybrid-pair2-20261206-s34.json)
    "FQ_HEAD_ROWS": 0,
    # FQ_STREAM of the verify build (-1: the step's): words decoded as used speed a large
    # layer's step and slow its verify (_LARGE below)
    "FQ_VERIFY_STREAM": -1,
    # FQ_SMEM_X of the verify build (0: the step's): a verify of 8 rows a pass stages more of
    # its x, where a step asking for as much shared memory loses L1 (_EIGHT_ROWS below)
    "FQ_VERIFY_SMEM_X": 0,
    # 1: the staged x's 16-byte pieces permuted within each 128-byte row, so a quarter warp's
    # reads meet no bank twice (fused_step.cuh's fq_staged_at; the same bits)
    "FQ_SWIZZLE": 0,
    # a row length (0: off): 4-, 6- and 8-bit parts' rows of at least this many weights load
    # 32 weights a lane (16 bytes of Q4 with one scale and bias) where they load 8,
    # FQ_WIDE_SLICES such slices at once. A lane sums other weights, so a row's bits differ
    # from FQ_WIDE=0's build; every build with the same FQ_WIDE gives a row the same bits
    # (fused_step.cuh's fq_dot_wide; step_weights.check_wide refuses groups it cannot read)
    "FQ_WIDE": 0,
    "FQ_WIDE_SLICES": 4,
    # a row length (0: off): dot products over rows of at least this many weights take x
    # rounded to int8 in blocks of 32 (as the CPU's int8 kernels, kernels/int8_ref.py) and
    # meet 4- and 6-bit rows four weights a dp4a, x staged in passes of the rows that fit the
    # staged x's shared memory (fused_step.cuh's fq_dot_i8, fq_stage_i8). Its rows' bits are
    # its own, the same in every build with the same FQ_INT8; the products of 8 rows of x
    # cost 2.4 of one row's in the probe where float x's cost 5.1 (docs/BENCHMARKS.md,
    # session 41). rows_that_fit checks a shape's builds against their shared memory.
    "FQ_INT8": 0,
    # 0: FQ_INT8 only where a norm precedes the product (qkv, gate_up, the head; fused_step.cuh's
    # fq_int8), the residual phases (o, down, out_proj) keep float x: their float dot product
    # has no norm to fold in, and each block's staging of their x in int8 cost the 1B shape's
    # step 1.9 and 7.0 us a layer (docs/BENCHMARKS.md, session 42)
    "FQ_INT8_RESIDUAL": 1,
    # 1: FQ_INT8's x of the o and down phases is rounded once, by the phases that write it
    # (the attention a head at a time, gate_up a block's 32 outputs at a time), and the
    # blocks of o and down copy its bytes; 0: each block rounds its own copy (the same bits;
    # fused_step.cuh's fq_stage_once). On the 1B shape its 8-row verify was 18-22% faster
    # than float x's and its step 6-11% slower (docs/BENCHMARKS.md, session 44).
    "FQ_INT8_ONCE": 0,
}
# shared memory an SM lends the staged x of its blocks (an H100/H200 SM has 228 KB; the
# attention's own arrays and the runtime's reserve take the rest)
SMEM_X_BYTES_PER_SM = 192 << 10
# layers above this size take two blocks an SM for a decode step and one for a verify
# (measured on the H200 with bench/gpu/step_tuning.py, docs/BENCHMARKS.md: decode 1.4-1.6x
# on Llama-3.2-1B and 3.1-8B shapes, 1.1-1.2x slower on the default model, whose phases are
# too short to fill 16 warps). A verify takes 4 rows a pass (17% / 5% faster on the 1B at
# 128 / 2,048 tokens, 6% on the default model) where the build keeps its registers: not
# with q/k norm, whose phase spills at 4.
TWO_BLOCKS_LAYER_BYTES = 8 << 20
_LARGE = {"FQ_BLOCKS": 2, "FQ_VERIFY_BLOCKS": 1}
# A large layer's step decodes its words as used, its verify not: on an H100 the Llama-3.1-8B
# shape's step took 6.29 / 6.76 ms at 128 / 2,048 context against 6.64-6.88 / 7.23-7.32 with
# the engine's build timed before and after, its 8-row verify 35.3 / 41.2 against 36.3-36.6 /
# 41.7-41.8; the 3.2-1B's step 1.51 / 1.66 against 1.53-1.57 / 1.70-1.75, its verify within
# 2% (session 36, docs/h100/ahead-llama-3.1-8b-20261206-s36.txt; session 35's run of the 8B
# agreed: 6.33 / 6.73 against 6.66 / 7.43). Every build's logits were the engine build's.
_LARGE |= {"FQ_STREAM": 1, "FQ_VERIFY_STREAM": 0}
_FOUR_ROWS = {"FQ_VERIFY_ROWS": 4, "FQ_SMEM_X": 16384}  # x staged: 4 rows of 4,096
# A large layer's verify takes 8 rows a pass, with 6 rows of 4,096 staged (without q/k norm,
# whose phase spills at 4 already): on an H100 the Llama-3.1-8B shape's 8-row verify took
# 28.1 / 33.4-33.8 ms at 128 / 2,048 context against 35.2-35.4 / 40.8-41.0 at 4 rows (30.3 /
# 35.7 with the step's 16,384 floats staged), the 3.2-1B's 5.34 / 6.95 against 5.63-5.74 /
# 7.03-7.15; a step asking for 24,576 floats too was 1-5% slower (session 37,
# docs/h100/ahead-rows8-*-20261206-s37.txt). Every build's logits were the engine build's.
_EIGHT_ROWS = {"FQ_VERIFY_ROWS": 8, "FQ_VERIFY_SMEM_X": 24576}


# A hybrid (Gated DeltaNet layers) takes one block an SM whatever its layers' size, and
# 16 slices a load: on the Qwen3.5-0.8B shape a decode step's launch took 1.87 ms against
# 3.30 ms with _LARGE and 8 slices, a verify of 8 rows 5.17 against 6.34, the same bits
# (docs/h200/step-tuning-qwen3.5-0.8b-20261203-s16.json); its builds spill anyway. And the
# release / acquire barrier: on an H100 (session 34, docs/h100/barrier-hybrid-20261206-s34.json)
# the shape's step took 1.495 / 1.566 ms at 128 / 2,048 context against 1.552 and 1.540 /
# 1.607 and 1.602 with the fences (timed before and after it), an 8-row verify 5.12 / 5.68
# against 5.01 / 5.74, every build's logits the engine build's. A verify takes 4 rows a pass
# (its q/k norms' build spills there, and is faster all the same): 8 rows 4.88 / 5.57 ms
# against 5.21-5.28 / 5.92-6.02 at 2 (timed first and last; 8 rows a pass 4.86 / 5.82; the
# head alone at 8 no better), the same bits (docs/h100/verify-rows-hybrid-20261206-s35.json).
_HYBRID = {"FQ_BLOCKS": 1, "FQ_VERIFY_BLOCKS": 0, "FQ_SLICES": 16, "FQ_BARRIER": 1}
_HYBRID |= {"FQ_VERIFY_ROWS": 4, "FQ_SMEM_X": 16384}


def tuning_for(layer_bytes: int, qk_norm: bool = False, hybrid: bool = False) -> dict[str, int]:
    """The engine's knobs for a model whose largest layer's table is `layer_bytes`."""
    knobs = dict(TUNING) if qk_norm else TUNING | _FOUR_ROWS
    if hybrid:
        return knobs | _HYBRID
    if layer_bytes <= TWO_BLOCKS_LAYER_BYTES:
        return knobs
    return knobs | _LARGE | ({} if qk_norm else _EIGHT_ROWS)


# MLX's cuda_kernel writes the kernel's signature itself (`__global__ void name(...)`), so
# a build for two or more blocks an SM states its launch bounds through `__global__`: ptxas
# then keeps the registers within 65,536 / (THREADS * blocks).
_BOUNDED_GLOBAL = (
    "#undef __global__\n"
    "#define __global__ __location__(global) __launch_bounds__({threads}, {blocks})\n"
)


def smem_x(tuning: dict[str, int], verify: bool) -> int:
    """Floats of x a block of the decode build (one row) or the verify build stages."""
    knobs = TUNING | tuning
    return (knobs["FQ_VERIFY_SMEM_X"] or knobs["FQ_SMEM_X"]) if verify else knobs["FQ_SMEM_X"]


def blocks_per_sm(tuning: dict[str, int], verify: bool) -> int:
    """Blocks an SM of the decode build (one row) or the verify build (up to MAX_ROWS)."""
    knobs = TUNING | tuning
    return (knobs["FQ_VERIFY_BLOCKS"] or knobs["FQ_BLOCKS"]) if verify else knobs["FQ_BLOCKS"]


ROLES = ("QKV", "O", "GATE_UP", "DOWN", "HEAD")  # WeightTable.roles, fused_step.cuh's


def formats_header(
    formats: tuple[int, ...],
    tuning: dict[str, int] | None = None,
    verify: bool = False,
    roles: tuple[tuple[int, ...], ...] | None = None,
) -> str:
    """The format lists the weight dispatch is built for (FQ_FORMATS_<ROLE>: by role, as
    WeightTable.roles; a role without one, or without `roles`, takes `formats`) and the
    build's knobs (before the step header), for the decode build or, with `verify`, the
    verify's."""
    knobs = check_tuning(tuning or {})
    by_role = roles or (formats,) * len(ROLES)
    lines = [
        f"#define FQ_FORMATS_{name}(X) " + " ".join(f"X({f})" for f in codes or formats)
        for name, codes in zip(ROLES, by_role, strict=True)
    ]
    if verify and knobs["FQ_VERIFY_STREAM"] >= 0:
        knobs = knobs | {"FQ_STREAM": knobs["FQ_VERIFY_STREAM"]}
    knobs = knobs | {"FQ_SMEM_X": smem_x(knobs, verify)}
    lines += [f"#define {name} {int(value)}" for name, value in knobs.items()]
    header = "\n".join(lines) + "\n"
    blocks = blocks_per_sm(knobs, verify)
    if blocks > 1:
        header += _BOUNDED_GLOBAL.format(threads=THREADS, blocks=blocks)
    return header


def check_tuning(tuning: dict[str, int]) -> dict[str, int]:
    """TUNING with `tuning` over it; ValueError naming a knob that is unknown or out of
    range (BRANCHCHAT_STEP_TUNING is checked here at load, on any machine)."""
    knobs = TUNING | tuning
    unknown = set(knobs) - set(TUNING)
    if unknown:
        raise ValueError(
            f"unknown step kernel knobs {sorted(unknown)} (known: {', '.join(TUNING)})"
        )
    if not 1 <= knobs["FQ_BLOCKS"] <= 4 or not 0 <= knobs["FQ_VERIFY_BLOCKS"] <= 4:
        raise ValueError(
            f"FQ_BLOCKS must be 1..4 and FQ_VERIFY_BLOCKS 0..4, not {knobs['FQ_BLOCKS']} "
            f"and {knobs['FQ_VERIFY_BLOCKS']}"
        )
    if knobs["FQ_STREAM"] not in (0, 1) or knobs["FQ_VERIFY_STREAM"] not in (-1, 0, 1):
        raise ValueError(
            f"FQ_STREAM must be 0 or 1 and FQ_VERIFY_STREAM -1, 0 or 1, not "
            f"{knobs['FQ_STREAM']} and {knobs['FQ_VERIFY_STREAM']}"
        )
    if knobs["FQ_SWIZZLE"] not in (0, 1) or knobs["FQ_WIDE"] < 0 or knobs["FQ_WIDE"] % 32:
        raise ValueError(
            f"FQ_SWIZZLE must be 0 or 1 and FQ_WIDE 0 or a multiple of 32, not "
            f"{knobs['FQ_SWIZZLE']} and {knobs['FQ_WIDE']}"
        )
    if knobs["FQ_INT8"] < 0 or knobs["FQ_INT8"] % 32:
        raise ValueError(f"FQ_INT8 must be 0 or a multiple of 32, not {knobs['FQ_INT8']}")
    if knobs["FQ_INT8_RESIDUAL"] not in (0, 1):
        raise ValueError(f"FQ_INT8_RESIDUAL must be 0 or 1, not {knobs['FQ_INT8_RESIDUAL']}")
    if knobs["FQ_INT8_ONCE"] not in (0, 1):
        raise ValueError(f"FQ_INT8_ONCE must be 0 or 1, not {knobs['FQ_INT8_ONCE']}")
    if not 1 <= knobs["FQ_WIDE_SLICES"] <= 16:
        raise ValueError(f"FQ_WIDE_SLICES must be 1..16, not {knobs['FQ_WIDE_SLICES']}")
    if knobs["FQ_HEAD_ROWS"] not in (0, 1, 2, 4, 8):
        raise ValueError(f"FQ_HEAD_ROWS must be 0, 1, 2, 4 or 8, not {knobs['FQ_HEAD_ROWS']}")
    for verify, name in ((False, "FQ_SMEM_X"), (True, "FQ_VERIFY_SMEM_X")):
        staged, blocks = smem_x(knobs, verify), blocks_per_sm(knobs, verify)
        if knobs[name] < 0 or staged % 8 or blocks * 4 * staged > SMEM_X_BYTES_PER_SM:
            raise ValueError(
                f"{name} must be a multiple of 8 whose blocks fit "
                f"{SMEM_X_BYTES_PER_SM} bytes an SM, not {staged} x {blocks} blocks"
            )
    return knobs


def int8_rows_that_fit(row: int, tuning: dict[str, int], verify: bool) -> int:
    """Rows of x [., row] a block of the build stages at once in int8 (fused_step.cuh's
    fq_int8_row_bytes: the int8s, a scale a 32, 8 warps' parts of the sum of squares)."""
    return 4 * smem_x(tuning, verify) // (row + row // 8 + 4 * (THREADS // 32))


def check_int8(rows: tuple[int, ...], tuning: dict[str, int]) -> None:
    """TuningRefused where FQ_INT8 takes a phase's rows of x (lengths `rows`: the model's
    hidden size, attention width, MLP width...) and a build's shared memory cannot stage a
    pass of them: the decode build's one row, the verify build's FQ_VERIFY_ROWS (and its
    LM head's FQ_HEAD_ROWS)."""
    knobs = TUNING | tuning
    if not knobs["FQ_INT8"]:
        return
    verify_rows = max(knobs["FQ_VERIFY_ROWS"], knobs["FQ_HEAD_ROWS"])
    for row in rows:
        if row < knobs["FQ_INT8"] or row % 32:
            continue
        for verify, need in ((False, 1), (True, verify_rows)):
            fit = int8_rows_that_fit(row, knobs, verify)
            if fit < need:
                name = "FQ_VERIFY_SMEM_X" if verify else "FQ_SMEM_X"
                raise TuningRefused(
                    f"FQ_INT8: a pass of {need} rows of {row} int8s does not fit the "
                    f"{'verify' if verify else 'decode'} build's {4 * smem_x(knobs, verify)} "
                    f"bytes of staged x (raise {name})"
                )
