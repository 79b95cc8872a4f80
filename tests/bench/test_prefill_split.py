"""bench/gpu/prefill_split.py on this machine's MLX, on a test-size hybrid: what it times
is the engine's own forward, and its per-kind sums name every layer once."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("mlx.core")

import mlx.core as mx  # noqa: E402

from bench.gpu import prefill_split  # noqa: E402
from bench.shapes import SHAPES  # noqa: E402
from bench.shapes_gguf import write_gguf  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.loader import load_model  # noqa: E402
from kernels import gated_delta_cuda  # noqa: E402


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return write_gguf(SHAPES["tiny-qwen3.5"], tmp_path_factory.mktemp("split") / "h.gguf")


def test_the_timed_forward_is_the_engines_forward(hybrid):
    runner = load_model(hybrid, replace(EngineConfig.from_environment(), backend="mlx")).runner
    ids = np.arange(40, dtype=np.int64) * 7 % runner.model.config.vocab_size
    *_, timed = prefill_split.forward(runner, ids)
    state = runner.new_state()
    engine = runner.forward(ids.tolist(), state)
    np.testing.assert_array_equal(np.array(timed)[-1], np.array(engine)[-1])
    assert state.offset == 40
    kinds = prefill_split.layers(runner, ids)
    names = [type(layer.mixer).__name__ for layer in runner.model.layers]
    assert {k: v["layers"] for k, v in kinds.items()} == {n: names.count(n) for n in set(names)}
    assert set(kinds) == {"GatedDeltaNet", "AttentionBlock"}


def test_the_probe_times_each_length_and_each_way_a_chunk_may_run(hybrid):
    out = prefill_split.probe(hybrid, [24, 40], runs=1, pairs=[(30, 30), (20, 90)])
    modes = out["gdn_prefill"]
    # the CUDA recurrence is a second way only where MLX runs on CUDA
    assert list(modes) == ["chunked"] + ["recurrent"] * gated_delta_cuda.is_available()
    for lengths in modes.values():
        assert list(lengths) == ["24", "40"]
        for f in lengths.values():
            assert min(f["cold_ms"], f["new_length_ms"], f["build_ms"], f["eval_ms"]) > 0
            # each length's layer split names every layer of the tiny hybrid once
            assert {k: v["layers"] for k, v in f["layers"].items()} == {
                "GatedDeltaNet": 3,
                "AttentionBlock": 1,
            }
            # the recurrence timed on the inputs the forward handed it: q, k, v, g, beta
            # in the compute dtype and the float32 state, and on copies of them
            inside = f["gdn_in_model"]
            assert inside["dtypes"][:3] == [inside["dtypes"][0]] * 3
            assert inside["dtypes"][-1] == "mlx.core.float32"
            assert min(inside[f"{w}_ms"] for w in ("as_forwarded", "copies", "float32_copies")) > 0
    # every chunk size (and the CUDA kernel, there) computes the chunk-64 form's rows
    for kernels in out["gdn_kernel"].values():
        assert {"chunked_32", "chunked_64", "chunked_128", "chunked_256"} <= set(kernels)
        assert all(k["max_diff"] < 1e-4 and k["ms"] > 0 for k in kernels.values())
    # each way of attending (causal, masked, matmuls, padded to buckets) gives the same rows
    for ways in out["attention"].values():
        # and on CUDA, for a head size it is built for, the one-launch kernel
        assert set(ways) - {"kernel", "kernel_scalar"} == {
            "causal",
            "bool_mask",
            "matmul",
            "bucketed",
        }
        assert all(w["max_diff"] < 2e-2 and w["first_ms"] > 0 for w in ways.values())


def test_the_captured_inputs_are_the_first_layers_and_the_method_comes_back(hybrid):
    runner = load_model(hybrid, replace(EngineConfig.from_environment(), backend="mlx")).runner
    ops = runner.model.ops
    ids = np.arange(40, dtype=np.int64) * 5 % runner.model.config.vocab_size
    q, k, v, g, beta, state = prefill_split._captured(runner, ids)
    assert "gated_delta_chunked" not in vars(ops)  # the instance attribute is gone again
    mixer = next(m for m in (la.mixer for la in runner.model.layers) if hasattr(m, "nv"))
    assert q.shape == k.shape == (40, mixer.nv, mixer.dk) and v.shape == (40, mixer.nv, mixer.dv)
    assert g.shape == beta.shape == (40, mixer.nv) and state.shape == (mixer.nv, mixer.dk, mixer.dv)
    # a fresh state's first chunk: the recurrence starts from zeros, q and k unit rows
    assert not np.array(state).any()
    norms = np.linalg.norm(np.array(k.astype(mx.float32)), axis=-1)
    np.testing.assert_allclose(norms, 1.0, rtol=2e-2)  # l2-normed keys
    # a forward of rows the token-by-token kernel takes hands the chunk kernel nothing
    assert prefill_split._captured(runner, ids[:8]) is None
