"""A GPU forward may hand each layer's rows to the device as soon as they are built
(`MlxOps.overlap_layers`): the same logits, every layer started once. MLX's CPU device
runs the same asynchronous evaluation, so the check runs on any machine."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from engine.config import EngineConfig
from engine.loader import load_model


def test_overlapped_layers_give_the_same_logits(
    tiny_llama_q4_gguf: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = tiny_llama_q4_gguf
    model = load_model(path, EngineConfig(backend="mlx")).model
    ids = [3, 9, 4, 17, 2, 8, 11, 5]
    plain = np.array(model.forward(ids, model.new_state(), logits="all"))
    started: list[int] = []
    real_async_eval = mx.async_eval

    def counting_async_eval(*xs: mx.array) -> None:
        started.append(len(xs))
        real_async_eval(*xs)

    monkeypatch.setattr(mx, "async_eval", counting_async_eval)
    model.ops.overlap_layers = True
    state = model.new_state()
    overlapped = np.array(model.forward(ids, state, logits="all"))
    assert started == [1] * model.config.num_layers
    np.testing.assert_array_equal(overlapped, plain)
    # and the state it left decodes on exactly as the plain one
    model.ops.overlap_layers = False
    reference = model.new_state()
    model.forward(ids, reference, logits="none")
    np.testing.assert_array_equal(
        np.array(model.forward([6], state)), np.array(model.forward([6], reference))
    )
