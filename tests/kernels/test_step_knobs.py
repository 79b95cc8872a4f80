"""The one-launch step's build knobs without a GPU (kernels/step_knobs.py): their names and
ranges, each build's own blocks, staged x and words, and the engine's values by layer size,
each one measured on an H100 or H200 (docs/BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from kernels import fused_step_cuda as fs


def test_build_knobs_are_named_and_checked():
    from bench.gpu.step_tuning import engine_with, parse_configs

    values = (16, 1, 4, 1, 8192, 0, 0, 0, 0, 1, 0, -1, 0, 0, 0, 4, 0, 1, 0)  # the fields' order
    assert parse_configs("16:1:4") == [dict(zip(fs.TUNING, values, strict=True))]
    assert parse_configs("16:0:2:1:8192:0:1:0:0:1:8")[0]["FQ_HEAD_ROWS"] == 8
    assert parse_configs("8:0:2:2:8192:0:0:0:1")[0]["FQ_KFACTORS"] == 1
    assert parse_configs("8:0:4:1:16384:0:0:0:0:0")[0]["FQ_SPREAD"] == 0
    assert parse_configs("8:0:2:2")[0]["FQ_BLOCKS"] == 2
    assert parse_configs("8:0:2:1:0")[0]["FQ_SMEM_X"] == 0
    with pytest.raises(SystemExit, match="slices:stream:rows"):
        parse_configs("8:0")
    with pytest.raises(ValueError, match="FQ_BLOCKS"):
        fs.formats_header((4,), {"FQ_BLOCKS": 0})
    with pytest.raises(ValueError, match="FQ_SMEM_X must be a multiple of 8"):
        fs.formats_header((4,), {"FQ_SMEM_X": 100})
    for knob, value in (("FQ_HEAD_ROWS", 3), ("FQ_STREAM", 2), ("FQ_VERIFY_STREAM", 2)):
        with pytest.raises(ValueError, match=f"{knob} must be .* not {value}|not .* and {value}"):
            fs.formats_header((4,), {knob: value})
    both = {"FQ_STREAM": 1, "FQ_VERIFY_STREAM": 0}  # words decoded as used in the step alone
    assert "#define FQ_STREAM 1" in fs.formats_header((4,), both)
    assert "#define FQ_STREAM 0" in fs.formats_header((4,), both, verify=True)
    varied = engine_with(fs.TUNING, "FQ_KFACTORS=1;FQ_STREAM=1,FQ_VERIFY_STREAM=0")
    assert varied[0] == varied[-1] == fs.TUNING and len(varied) == 4  # the engine's on each side
    assert varied[1] == fs.TUNING | {"FQ_KFACTORS": 1} and varied[2]["FQ_VERIFY_STREAM"] == 0
    with pytest.raises(ValueError, match="unknown step kernel knobs"):
        engine_with(fs.TUNING, "FQ_AHEAD=1")
    with pytest.raises(ValueError, match="blocks fit"):
        fs.formats_header((4,), {"FQ_SMEM_X": 32768, "FQ_BLOCKS": 2})
    assert "#define FQ_SMEM_X 16384" in fs.formats_header((4,), {"FQ_SMEM_X": 16384})
    # the verify build's staged x its own (0: the step's), each checked for its blocks
    own = {"FQ_BLOCKS": 2, "FQ_VERIFY_BLOCKS": 1, "FQ_VERIFY_SMEM_X": 24576}
    assert "#define FQ_SMEM_X 8192" in fs.formats_header((4,), own)
    assert "#define FQ_SMEM_X 24576" in fs.formats_header((4,), own, verify=True)
    assert fs.smem_x({}, True) == fs.smem_x({}, False) == 8192
    assert parse_configs("8:0:8:2:16384:1:0:0:0:1:0:0:24576")[0]["FQ_VERIFY_SMEM_X"] == 24576
    with pytest.raises(ValueError, match="FQ_VERIFY_SMEM_X must be .* not 32768 x 2 blocks"):
        fs.formats_header((4,), own | {"FQ_VERIFY_BLOCKS": 2, "FQ_VERIFY_SMEM_X": 32768})
    assert parse_configs("8:0:8:2:16384:1")[0]["FQ_VERIFY_BLOCKS"] == 1
    wide = parse_configs("8:1:2:2:8192:1:0:0:0:1:0:0:0:1:2048:8")[0]
    assert (wide["FQ_SWIZZLE"], wide["FQ_WIDE"], wide["FQ_WIDE_SLICES"]) == (1, 2048, 8)
    assert "#define FQ_WIDE 2048" in fs.formats_header((4,), {"FQ_WIDE": 2048})
    for knob, value in (("FQ_WIDE", 48), ("FQ_WIDE", -32), ("FQ_SWIZZLE", 2)):
        with pytest.raises(ValueError, match="FQ_SWIZZLE must be 0 or 1 and FQ_WIDE 0 or a mul"):
            fs.formats_header((4,), {knob: value})
    for value in (0, 17):
        with pytest.raises(ValueError, match=f"FQ_WIDE_SLICES must be 1..16, not {value}"):
            fs.formats_header((4,), {"FQ_WIDE_SLICES": value})
    assert "#define FQ_INT8_ONCE 1" in fs.formats_header((4,), {"FQ_INT8_ONCE": 1})
    for value in (-1, 2):
        with pytest.raises(ValueError, match=f"FQ_INT8_ONCE must be 0 or 1, not {value}"):
            fs.formats_header((4,), {"FQ_INT8_ONCE": value})


def test_the_verify_build_may_take_its_own_blocks():
    """Two blocks an SM for decode, one for a verify of 8 rows a pass: each build states
    its own launch bounds (MAXM is a template argument, the bounds are in the header)."""
    tuning = {"FQ_BLOCKS": 2, "FQ_VERIFY_BLOCKS": 1}
    assert (fs.blocks_per_sm(tuning, False), fs.blocks_per_sm(tuning, True)) == (2, 1)
    assert "__launch_bounds__(256, 2)" in fs.formats_header((4,), tuning, verify=False)
    assert "__launch_bounds__" not in fs.formats_header((4,), tuning, verify=True)
    assert fs.blocks_per_sm({"FQ_BLOCKS": 2}, True) == 2  # 0: as the decode build
    assert "__launch_bounds__" not in fs.formats_header((4,))
    assert "#define FQ_VERIFY_ROWS 2" in fs.formats_header((4,))
    # each role's dispatch its own (its own registers); a role with none takes every format
    header = fs.formats_header((4, 6), roles=((4, 6), (4,), (), (4, 6), (8,)))
    for line in ("QKV(X) X(4) X(6)", "O(X) X(4)\n", "GATE_UP(X) X(4) X(6)", "HEAD(X) X(8)"):
        assert f"#define FQ_FORMATS_{line}" in header
    assert "#define FQ_FORMATS_HEAD(X) X(4) X(6)" in fs.formats_header((4, 6))
    with pytest.raises(ValueError, match="FQ_TYPO"):
        fs.formats_header((4,), {"FQ_TYPO": 1})


def test_large_layers_take_two_blocks_an_sm():
    """kernels/fused_step_cuda.tuning_for: measured 1.4-1.6x on 1B and 8B shapes, slower on
    the default model (docs/BENCHMARKS.md)."""
    small, large = fs.tuning_for(2 << 20), fs.tuning_for(40 << 20)
    assert (small["FQ_BLOCKS"], large["FQ_BLOCKS"]) == (1, 2)
    assert (fs.blocks_per_sm(small, True), fs.blocks_per_sm(large, True)) == (1, 1)
    assert small["FQ_VERIFY_ROWS"] == 4  # measured: faster than 2
    assert small["FQ_SMEM_X"] == large["FQ_SMEM_X"] == 16384
    # a large layer's verify: 8 rows a pass, 24,576 floats staged (s37, an H100)
    assert (large["FQ_VERIFY_ROWS"], fs.smem_x(large, True), fs.smem_x(small, True)) == (
        8, 24576, 16384,
    )  # fmt: skip
    for size in (2 << 20, 40 << 20):
        qk = fs.tuning_for(size, qk_norm=True)
        assert (qk["FQ_VERIFY_ROWS"], fs.smem_x(qk, True)) == (2, 8192)  # spills at 4
    assert "__launch_bounds__" not in fs.formats_header((4,), large, verify=True)
    hybrid = fs.tuning_for(40 << 20, qk_norm=True, hybrid=True)  # measured on the 0.8B
    assert (hybrid["FQ_BLOCKS"], fs.blocks_per_sm(hybrid, True), hybrid["FQ_SLICES"]) == (1, 1, 16)
    assert hybrid["FQ_BARRIER"] == 1 and small["FQ_BARRIER"] == large["FQ_BARRIER"] == 0
    assert (hybrid["FQ_VERIFY_ROWS"], hybrid["FQ_SMEM_X"]) == (4, 16384)  # s35, an H100
    # a large layer's step decodes its words as used, its verify not (s35 and s36, an H100)
    assert (large["FQ_STREAM"], small["FQ_STREAM"], hybrid["FQ_STREAM"]) == (1, 0, 0)
