"""The nucleus pack and the device's draw as one CUDA kernel (kernels/nucleus_pack_cuda.py)
against MLX's operations (engine/device_sampling.py's `pack` and `_token_among`) and the
host's draw from the whole row; runs only where MLX has CUDA, and skips on the CPU."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from engine import device_sampling, sampling, sampling_candidates
from engine.sampling import SamplingSettings
from kernels import nucleus_pack_cuda

pytestmark = [
    pytest.mark.skipif(not nucleus_pack_cuda.is_available(), reason="needs MLX on a CUDA GPU"),
    pytest.mark.gpu,
]
K = sampling_candidates.K


class _At:
    def __init__(self, u: float) -> None:
        self.u = u

    def uniform(self, position: int) -> float:
        return self.u


def _rows(seed: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for vocab in (300, 4096, 49152):
        out.append((f"normal{vocab}", rng.normal(0, 3, vocab)))
        out.append((f"peaked{vocab}", rng.normal(0, 1, vocab) + 12 * (rng.random(vocab) < 0.002)))
        out.append((f"flat{vocab}", rng.normal(0, 0.05, vocab)))
        wide = mx.array(rng.normal(0, 4, vocab).astype(np.float32))  # bfloat16: many ties
        out.append((f"bf16{vocab}", np.asarray(wide.astype(mx.bfloat16).astype(mx.float32))))
    return [(name, row.astype(np.float32)) for name, row in out]


def _kernel(rows: np.ndarray, t: float, top_p: float, u: float) -> tuple[np.ndarray, np.ndarray]:
    packed, token = nucleus_pack_cuda.pack_and_draw(mx.array(rows), K, t, top_p, u)
    return np.asarray(packed), np.asarray(token)


def _rest_bound(packed: np.ndarray, row: np.ndarray, t: float) -> tuple[float, float]:
    """The other tokens' float64 weight, and the error sampling_candidates.decide allows
    the pack's float32 one."""
    least = packed[:K].min()
    x = row.astype(np.float64) / t
    want = float(np.exp(x - x.max())[row < least].sum())
    argument = 4 * (float(np.abs(packed[:K]).max()) / t + 40) * 2.0**-24
    spread = want * (row.size * 2.0**-24 + argument + sampling_candidates.EXP_ERROR)
    return want, spread + sampling_candidates.UNDERFLOW


@pytest.mark.parametrize("temperature", [0.2, 0.7, 1.3])
def test_the_pack_is_mlxs_pack(temperature: float) -> None:
    edge_ties = 0
    for name, row in _rows(int(temperature * 10)):
        got = _kernel(row[None], temperature, 0.9, 0.5)[0][0]
        want = np.asarray(device_sampling.pack(mx.array(row), temperature))
        assert got[2 * K + 1] == want[2 * K + 1] and got[2 * K + 2] == row.size, name
        ids = got[K : 2 * K].astype(np.int64)
        assert len(set(ids.tolist())) == K and ids.min() >= 0 and ids.max() < row.size, name
        np.testing.assert_array_equal(got[:K], row[ids], err_msg=name)  # each id's own logit
        if want[2 * K + 1] == K:  # no tie at the edge: the same K tokens
            order, other = np.argsort(ids), np.argsort(want[K : 2 * K])
            np.testing.assert_array_equal(ids[order], want[K : 2 * K][other].astype(np.int64))
        else:
            edge_ties += 1
            assert np.sort(got[:K])[0] == np.sort(want[:K])[0], name  # the same least
        rest, spread = _rest_bound(got, row, temperature)
        assert abs(float(got[2 * K]) - rest) <= spread, (name, got[2 * K], rest)
    assert edge_ties  # the bfloat16 rows put ties at the edge: that case was met


def test_rows_in_one_launch_pack_as_each_alone() -> None:
    rng = np.random.default_rng(5)
    rows = rng.normal(0, 3, (5, 49152)).astype(np.float32)
    together = _kernel(rows, 0.7, 0.95, 0.3)[0]
    for i in range(5):
        np.testing.assert_array_equal(
            _sorted(together[i]), _sorted(_kernel(rows[i : i + 1], 0.7, 0.95, 0.3)[0][0])
        )


def _sorted(packed: np.ndarray) -> np.ndarray:
    order = np.argsort(packed[K : 2 * K])
    return np.concatenate([packed[:K][order], packed[K : 2 * K][order], packed[2 * K :]])


@pytest.mark.parametrize("temperature,top_p", [(0.7, 0.95), (0.2, 0.5), (1.3, 0.9)])
def test_the_hosts_draw_from_the_kernels_pack_is_the_whole_rows(
    temperature: float, top_p: float
) -> None:
    s = SamplingSettings(temperature=temperature, top_p=top_p)
    rng = np.random.default_rng(11)
    decided = asked = 0
    for name, row in _rows(int(top_p * 100)):
        packed = _kernel(row[None], temperature, top_p, 0.5)[0][0]
        for u in [*rng.random(8), 0.0, np.nextafter(1.0, 0.0)]:
            asked += 1
            token = sampling_candidates.decide(packed, s, float(u))
            if token is not None:
                decided += 1
                assert token == sampling.sample(row, [], s, _At(float(u))), (name, u)
    assert decided >= asked // 4


@pytest.mark.parametrize("temperature,top_p", [(0.7, 0.95), (0.2, 0.5), (1.3, 0.9)])
def test_the_kernels_token_is_the_draw_from_its_pack(temperature: float, top_p: float) -> None:
    """The device's guess agrees with `_token_among` on the same pack and with the host's
    draw wherever that decides, but where float32 sums in another order meet a boundary."""
    rng = np.random.default_rng(3)
    s = SamplingSettings(temperature=temperature, top_p=top_p)
    among = agree = host = host_agree = 0
    for _, row in _rows(int(temperature * 100)):
        for u in rng.random(10):
            packed, token = _kernel(row[None], temperature, top_p, float(u))
            at = mx.array(float(u), dtype=mx.float32)
            want = int(
                np.asarray(
                    device_sampling._token_among(mx.array(packed[0]), at, temperature, top_p)
                )[0]
            )
            among += 1
            agree += int(token[0]) == want
            decided = sampling_candidates.decide(packed[0], s, float(u))
            if decided is not None:
                host += 1
                host_agree += int(token[0]) == decided
    assert agree >= 0.97 * among and host_agree >= 0.97 * host and host >= among // 4


def test_a_nan_anywhere_leaves_the_host_to_read_the_row() -> None:
    row = np.random.default_rng(1).normal(0, 3, 49152).astype(np.float32)
    row[40000] = np.nan
    packed = _kernel(row[None], 0.7, 0.95, 0.5)[0][0]
    assert (
        sampling_candidates.decide(packed, SamplingSettings(temperature=0.7, top_p=0.95), 0.5)
        is None
    )


@pytest.mark.real_model
def test_a_queued_nucleus_reply_of_the_default_model_packs_in_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default model (49,152 tokens) decodes a seeded nucleus reply queued, each step's
    pack and draw from the kernel, as it decodes it one synchronous step at a time."""
    from engine.config import EngineConfig
    from engine.default_model import default_model_path, is_default_model_present
    from engine.loader import load_model
    from engine.runner.runner import ModelRunner
    from tests.engine.test_launch_ahead import _count_launches, _decode

    if not is_default_model_present():
        pytest.skip("the default model is not fetched")
    runner = load_model(default_model_path(), EngineConfig(backend="mlx")).runner  # as served
    s = SamplingSettings(temperature=0.8, top_p=0.9, seed=7)
    with monkeypatch.context() as m:
        m.setattr(ModelRunner, "can_launch_ahead", lambda self, state, taps=None: False)
        want = _decode(runner, max_tokens=32, settings=s)
    calls: list[Any] = []
    real = nucleus_pack_cuda.pack_and_draw

    def counting(*args: Any) -> Any:
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(nucleus_pack_cuda, "pack_and_draw", counting)
    kinds = _count_launches(monkeypatch)
    got = _decode(runner, max_tokens=32, settings=s)
    monkeypatch.undo()
    assert got[0].token_ids == want[0].token_ids and got[1].tokens == want[1].tokens
    assert kinds.count("queued") >= 28 and len(calls) >= 28
