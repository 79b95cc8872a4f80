"""engine/device_sampling.py: the device's draw of a sampled token agrees with the host's
(engine/sampling.py) at nearly every uniform, transform by transform. Where it does not,
the decode loop undoes the queued step (tests/engine/test_launch_ahead.py)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from engine import device_sampling
from engine.sampling import SamplingSettings, draw, probabilities

SETTINGS = [
    SamplingSettings(temperature=0.7, top_p=0.95),
    SamplingSettings(temperature=1.0, top_k=40),
    SamplingSettings(temperature=1.2, min_p=0.05),
    SamplingSettings(temperature=0.8, top_p=0.9, top_k=50, min_p=0.02),
    SamplingSettings(temperature=1.0),
]


def _device(s: SamplingSettings, u: float, logits: np.ndarray) -> int:
    return int(np.asarray(device_sampling.draw(s, u)(mx.array(logits.astype(np.float32)))[0])[0])


@pytest.mark.parametrize(
    "s", SETTINGS, ids=lambda s: f"T{s.temperature}-p{s.top_p}-k{s.top_k}-m{s.min_p}"
)
def test_the_device_draws_the_hosts_token_at_nearly_every_uniform(s):
    rng = np.random.default_rng(0)
    agree = n = 0
    for _ in range(120):
        logits = (rng.standard_normal(4096) * 3).astype(np.float32)
        p = probabilities(logits, [], s)
        for u in rng.random(5):
            agree += _device(s, float(u), logits) == draw(p, float(u))
            n += 1
    # measured: 600 of 600 but for full-vocabulary draws, whose float32 CDF over 4,096
    # tokens rounds a boundary now and then (3 in 1,500)
    assert agree >= n - 3


def test_each_transform_cuts_what_the_hosts_does():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    top1 = SamplingSettings(temperature=1.0, top_k=1)
    nucleus = SamplingSettings(temperature=1.0, top_p=0.75)  # keeps 0.5 and 0.3
    floor = SamplingSettings(temperature=1.0, min_p=0.5)  # keeps p >= 0.25: 0.5 and 0.3
    for u in np.linspace(0.0, 0.999, 50):
        assert _device(top1, float(u), logits) == 0
        assert _device(nucleus, float(u), logits) == (0 if u < 0.5 / 0.8 else 1)
        assert _device(floor, float(u), logits) in (0, 1)
        for s in (top1, nucleus, floor):
            assert _device(s, float(u), logits) == draw(probabilities(logits, [], s), float(u))


def test_settings_it_cannot_follow_are_refused():
    assert not device_sampling.can_draw(SamplingSettings())  # greedy: the argmax
    penalized = SamplingSettings(temperature=0.8, repetition_penalty=1.2)
    assert not device_sampling.can_draw(penalized)
    with pytest.raises(ValueError, match="repetition penalty"):
        device_sampling.draw(penalized, 0.5)
