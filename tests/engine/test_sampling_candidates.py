"""The host's draw from the device's pack of the likeliest tokens
(engine/sampling_candidates.py): where it decides, `sampling.sample`'s token from the
whole row; where it cannot tell, None; and a queued nucleus reply drawn that way is the
synchronous reply."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from engine import device_sampling, sampling, sampling_candidates, verify_rows
from engine.sampling import SamplingSettings
from tests.engine.test_launch_ahead import PROMPT, _count_launches, _decode, _synchronous
from tests.engine.test_launch_ahead import runner as runner  # the fixture: every layer kind


class _At:
    """PositionalUniforms with one uniform for every position."""

    def __init__(self, u: float) -> None:
        self.u = u

    def uniform(self, position: int) -> float:
        return self.u


def _pack(row: np.ndarray, temperature: float) -> np.ndarray:
    return np.asarray(device_sampling.pack(mx.array(row), temperature))


def _rows(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    out = []
    for vocab in (100, 4096, 49152):
        out.append((f"normal{vocab}", rng.normal(0, 3, vocab)))
        out.append((f"peaked{vocab}", rng.normal(0, 1, vocab) + 12 * (rng.random(vocab) < 0.002)))
        out.append((f"flat{vocab}", rng.normal(0, 0.05, vocab)))  # a nucleus past the pack
        # bfloat16 logits, as the GPU's plain path gives them: many exact ties
        wide = mx.array(rng.normal(0, 4, vocab).astype(np.float32))
        out.append((f"bf16{vocab}", np.asarray(wide.astype(mx.bfloat16).astype(mx.float32))))
    return [(name, row.astype(np.float32)) for name, row in out]


@pytest.mark.parametrize("temperature", [0.2, 0.7, 1.3])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95, 0.999])
def test_a_decision_is_the_whole_rows_draw(temperature: float, top_p: float) -> None:
    rng = np.random.default_rng(int(temperature * 10 + top_p * 1000))
    s = SamplingSettings(temperature=temperature, top_p=top_p)
    decided = asked = 0
    for name, row in _rows(rng):
        packed = _pack(row, temperature)
        for u in [*rng.random(12), 0.0, np.nextafter(1.0, 0.0)]:
            token = sampling_candidates.decide(packed, s, float(u))
            asked += 1
            if token is not None:
                decided += 1
                assert token == sampling.sample(row, [], s, _At(float(u))), (name, u)
    assert decided >= asked // 4  # the comparison is not vacuous (wide nuclei are refused)


def test_real_logits_are_decided_from_the_pack() -> None:
    """Logits of a real-sized vocabulary with a few likely tokens, the app's settings."""
    rng = np.random.default_rng(3)
    s = SamplingSettings(temperature=0.7, top_p=0.95)
    for _ in range(20):
        row = (rng.normal(0, 2, 49152) + 15 * (rng.random(49152) < 0.0005)).astype(np.float32)
        u = float(rng.random())
        token = sampling_candidates.decide(_pack(row, 0.7), s, u)
        assert token == sampling.sample(row, [], s, _At(u))


def test_what_the_pack_cannot_tell_is_refused() -> None:
    s = SamplingSettings(temperature=1.0, top_p=0.9)
    rng = np.random.default_rng(0)
    row = (rng.normal(0, 1, 4096) + 10 * (rng.random(4096) < 0.005)).astype(np.float32)
    packed = _pack(row, 1.0)
    k = (packed.size - 3) // 2
    assert sampling_candidates.decide(packed, s, 0.3) is not None
    tie = packed.copy()
    tie[2 * k + 1] = k + 1  # a token left out has the least kept logit
    assert sampling_candidates.decide(tie, s, 0.3) is None
    broken = packed.copy()
    broken[2 * k] = np.nan
    assert sampling_candidates.decide(broken, s, 0.3) is None
    # the others' weight so large that the nucleus runs past the pack
    heavy = packed.copy()
    heavy[2 * k] = 1e6
    assert sampling_candidates.decide(heavy, s, 0.3) is None
    # a cut the bound leaves open: the others' weight puts top_p on a running sum
    x = packed[:k].astype(np.float64)
    p = np.sort(np.exp(x - x.max()))[::-1]
    cum = np.cumsum(p)
    open_cut = packed.copy()
    open_cut[2 * k] = cum[10] / 0.9 - p.sum()  # the total at which cum[10] is exactly 0.9
    assert sampling_candidates.decide(open_cut, s, 0.3) is None
    # two tokens of one weight at the cut: which one is kept is the sort's choice
    tied = np.full(8, -20.0, np.float32)
    tied[:4] = [3.0, 2.0, 2.0, 1.0]
    at_the_cut = SamplingSettings(temperature=1.0, top_p=0.7)
    assert sampling_candidates.decide(_pack(tied, 1.0), at_the_cut, 0.5) is None


def test_settings_that_read_the_whole_row_keep_it() -> None:
    assert sampling_candidates.can_decide(SamplingSettings(temperature=0.7, top_p=0.95))
    for s in (
        SamplingSettings(temperature=0.7),  # no nucleus: the draw reads every weight
        SamplingSettings(temperature=0.7, top_p=0.9, top_k=40),
        SamplingSettings(temperature=0.7, top_p=0.9, min_p=0.05),
        SamplingSettings(),
    ):
        assert not sampling_candidates.can_decide(s)
        assert s.is_greedy or device_sampling.draw(s, 0.5)(mx.zeros((300,)))[1] is None


NUCLEUS = SamplingSettings(temperature=0.8, top_p=0.9, seed=7)


def test_a_queued_nucleus_reply_drawn_from_packs_is_the_synchronous_one(
    runner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _synchronous(runner, monkeypatch, max_tokens=24, settings=NUCLEUS)
    decided: list[bool] = []
    real = sampling_candidates.decide

    def counting(*args: Any) -> int | None:
        token = real(*args)
        decided.append(token is not None)
        return token

    monkeypatch.setattr(sampling_candidates, "decide", counting)
    kinds = _count_launches(monkeypatch)
    got, state = _decode(runner, max_tokens=24, settings=NUCLEUS)
    monkeypatch.undo()
    assert got.token_ids == want[0].token_ids
    assert state.tokens == want[1].tokens
    assert kinds[0] == "host" and kinds.count("queued") >= 20
    assert len(decided) >= 20 and sum(decided) >= len(decided) - 2


def test_a_nucleus_replys_verified_rows_are_drawn_from_packs(
    runner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeded speculation on the device's packs (`device_sampling.PackedRows`): drafts of
    the reply itself, a third of them corrupted, verified 3 at a time; the reply is the
    plain seeded one, token for token, and the verified rows were drawn from their packs."""
    from engine import decoding
    from tests.engine.test_speculative import ScriptedDrafter

    want = _synchronous(runner, monkeypatch, max_tokens=24, settings=NUCLEUS)[0].token_ids
    packed: list[int] = []
    real_to_host = verify_rows.to_host

    def to_host(ops: Any, logits: Any, s: SamplingSettings) -> Any:
        rows = real_to_host(ops, logits, s)
        packed.append(isinstance(rows, device_sampling.PackedRows))
        return rows

    decided: list[bool] = []
    real_decide = sampling_candidates.decide

    def decide(*args: Any) -> int | None:
        decided.append((token := real_decide(*args)) is not None)
        return token

    monkeypatch.setattr(verify_rows, "to_host", to_host)
    monkeypatch.setattr(sampling_candidates, "decide", decide)
    monkeypatch.setattr(decoding, "_choose_k", lambda *_: 3)
    drafter = ScriptedDrafter(PROMPT + want, corrupt=0.3, seed=2)
    got = _decode(runner, max_tokens=24, settings=NUCLEUS, drafter=drafter)[0]
    monkeypatch.undo()
    assert got.token_ids == want
    assert got.drafted >= 9 and 0 < got.accepted < got.drafted
    assert packed and all(packed)
    assert len(decided) >= len(want) - 1 and sum(decided) >= len(decided) - 2
