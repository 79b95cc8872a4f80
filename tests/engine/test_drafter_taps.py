"""A block drafter whose context rows are several target layers' outputs side by side
(a file's `target_layers`, training's --taps): every forward path hands out those rows
(the model's own, the C step's copies, the five CUDA kernels), equal to the layers'
outputs; speculation with such a drafter never changes the output; a path that cannot
hand them out (the one-launch GPU step) refuses the drafter by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.block_drafter import BlockDrafter, CapturingForward
from engine.config import EngineConfig
from engine.drafter_file import BlockDrafterWeights
from engine.errors import ModelLoadError, StateError
from engine.loader import load_model
from engine.sampling import SamplingSettings
from engine.sequence import prefill
from kernels import fused_decode_cuda
from tests.block_drafters import drafter_tensors, write_drafter
from tests.engine import test_speculative
from tests.engine.test_block_drafter import (
    SIGNATURE,
    assert_speculation_exact,
    greedy_and_sampled,
)
from tests.engine.test_speculative import (
    Case,
    Pair,
    RandomK,
)
from tests.tolerances import assert_rows_close, compute_dtype

pair = test_speculative.pair
cases = test_speculative.cases
random_k = test_speculative.random_k


def taps_of(target: Any) -> tuple[int, ...]:
    return (0, target.config.num_layers - 1)


@pytest.fixture
def tappable(pair: Pair) -> Pair:
    """The pair, where its runner hands out any layers' rows (not the one-launch step:
    test_the_one_launch_step_refuses_a_tapped_drafter_by_name)."""
    if pair.target.tap_problem(taps_of(pair.target)):
        pytest.skip("the one-launch step hands out the last layer's rows alone")
    return pair


def tapped_drafter(
    target: Any, tmp_path: Path, taps: tuple[int, ...], **kwargs: Any
) -> BlockDrafter:
    cfg = target.config
    tensors = drafter_tensors(cfg, seed=kwargs.pop("seed", 0))
    D = cfg.hidden_size
    rng = np.random.default_rng(7)
    tensors["fc.weight"] = (rng.standard_normal((D, len(taps) * D)) / np.sqrt(D)).astype(np.float32)
    meta = {"target_layers": ",".join(map(str, taps))}
    path = write_drafter(
        tmp_path / "tapped.safetensors", cfg, SIGNATURE, tensors=tensors, metadata=meta, **kwargs
    )
    return BlockDrafter(BlockDrafterWeights(path, target.model, SIGNATURE), target.model)


def layer_outputs(target: Any, tokens: list[int]) -> list[np.ndarray]:
    """Each layer's output rows of a fresh prefill, layer by layer through the model."""
    model, ops = target.model, target.ops
    state = model.new_state()
    x = ops.embed(model.embed, np.asarray(tokens, dtype=np.int64))
    if model.config.embed_scale != 1.0:
        x = x * model.config.embed_scale
    outs = []
    offset = state.begin_forward(len(tokens))
    for layer, layer_state in zip(model.layers, state.layers, strict=True):
        x = layer(x, layer_state, offset)
        outs.append(np.asarray(ops.to_numpy(x), dtype=np.float64))
    state.abort_forward()
    return outs


def test_every_path_hands_out_the_tapped_layers_rows(tappable: Pair) -> None:
    """The prefill (the model's path) and then single steps and a 3-row call (the C step
    on the CPU, the fused kernels on a GPU): each tapped layer's rows, side by side."""
    target = tappable.target
    taps = taps_of(target)
    tokens = [5, 9, 14, 2, 77, 31, 8, 40, 41, 12]
    want = layer_outputs(target, tokens)
    state = target.new_state()
    got: list[np.ndarray] = []
    capture = CapturingForward(
        target, lambda start, rows: got.append(target.ops.to_numpy(rows)), taps
    )
    prefill(capture, state, tokens[:6])
    for token in tokens[6:7]:
        capture.forward([token], state)
    capture.forward(tokens[7:], state, logits="all")
    rows = np.concatenate(got).astype(np.float64)
    D = target.config.hidden_size
    assert rows.shape == (len(tokens), 2 * D)
    dtype = compute_dtype(target.ops)
    for slot, layer in enumerate(taps):
        part = rows[:, slot * D : (slot + 1) * D]
        assert_rows_close(part, want[layer], dtype, D, 0, f"layer {layer}")
    # the model's own path, whatever the runner took above
    _, direct = target.model.forward_hidden(tokens, target.new_state(), "last", taps)
    assert_rows_close(target.ops.to_numpy(direct), rows, dtype, D, 0, "the model's path")
    # the untapped call still hands out the last layer's rows alone
    _, last = target.forward_hidden([3], state, "last")
    assert target.ops.to_numpy(last).shape == (1, D)


def test_the_c_step_checks_its_taps(pair: Pair) -> None:
    target = pair.target
    if getattr(target, "cpu_step", None) is None:
        pytest.skip("no C step on this path")
    state = target.new_state()
    for bad in ((1, 0), (0, target.config.num_layers)):
        with pytest.raises(ValueError, match="rising layer numbers"):
            target.cpu_step.forward_hidden([5, 6], state, "last", bad)
        assert state.offset == 0  # the failed call left nothing


@greedy_and_sampled
def test_speculation_with_a_tapped_drafter_never_changes_the_output(
    tappable: Pair,
    cases: list[Case],
    random_k: RandomK,
    tmp_path: Path,
    settings: SamplingSettings,
) -> None:
    target = tappable.target
    drafter = tapped_drafter(target, tmp_path, taps_of(target), block=9)
    assert drafter.taps == taps_of(target)
    assert_speculation_exact(target, drafter, cases[:3], random_k, settings)


def test_rows_of_another_width_fail_loudly(pair: Pair, tmp_path: Path) -> None:
    target = pair.target
    drafter = tapped_drafter(target, tmp_path, taps_of(target))
    drafter.begin([3, 4, 5])
    with pytest.raises(StateError, match="takes rows of"):
        drafter.observe_hidden(np.zeros((3, target.config.hidden_size), np.float32), 0)


def test_a_files_taps_are_checked_and_the_last_layer_alone_is_format_one(
    pair: Pair, tmp_path: Path
) -> None:
    target = pair.target
    last = target.config.num_layers - 1
    for bad in (f"{last},0", f"0,{last + 1}", "a,b"):
        path = write_drafter(
            tmp_path / "bad.safetensors", target.config, SIGNATURE, metadata={"target_layers": bad}
        )
        with pytest.raises(ModelLoadError, match="not rising layer numbers"):
            BlockDrafterWeights(path, target.model, SIGNATURE)
    path = write_drafter(
        tmp_path / "last.safetensors",
        target.config,
        SIGNATURE,
        metadata={"target_layers": str(last)},
    )
    assert BlockDrafterWeights(path, target.model, SIGNATURE).shape.taps == ()


def test_the_one_launch_step_refuses_a_tapped_drafter_by_name(pair: Pair) -> None:
    target = pair.target
    assert target.tap_problem(()) is None
    fused = getattr(target, "fused", None)
    if fused is None or fused.step_kernel is None:
        assert target.tap_problem(taps_of(target)) is None
        return
    assert "one-launch" in (target.tap_problem(taps_of(target)) or "")
    with pytest.raises(ValueError, match="last layer's rows alone"):
        fused.forward_hidden([5], target.new_state(), "last", taps_of(target))


@pytest.mark.skipif(not fused_decode_cuda.is_available(), reason="needs MLX on a CUDA GPU")
@pytest.mark.parametrize("compiled", [True, False], ids=["traced", "eager"])
def test_the_five_kernels_hand_out_the_tapped_layers_rows(tiny_models: Any, compiled: bool) -> None:
    """BRANCHCHAT_FUSED_MODE=layers: the rows of a decode step and a verify, each tapped
    layer's, as the model's own path gives them (float32: the kernels' arithmetic only)."""
    config = EngineConfig(backend="mlx", dtype="float32", fused_mode="layers")
    runner = load_model(tiny_models.gguf(qtype="F32")[0], config).runner
    assert runner.fused is not None and runner.fused.step_kernel is None
    runner.fused.compiled = compiled
    taps = taps_of(runner)
    assert runner.tap_problem(taps) is None
    tokens = [5, 9, 14, 2, 77, 31, 8, 40, 41, 12]
    state = runner.new_state()
    prefill(runner, state, tokens[:6])
    _, one = runner.forward_hidden(tokens[6:7], state, "last", taps)
    _, three = runner.forward_hidden(tokens[7:], state, "all", taps)
    assert runner.last_path == "fused"
    got = np.concatenate([runner.ops.to_numpy(one), runner.ops.to_numpy(three)])
    want = runner.ops.to_numpy(
        runner.model.forward_hidden(tokens, runner.new_state(), "last", taps)[1]
    )
    np.testing.assert_allclose(got, want[6:], rtol=2e-4, atol=2e-4)
