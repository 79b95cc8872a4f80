"""Speculation on the real default model: greedy lookup decoding replies token for token
as plain decoding does over one conversation (a regenerate, one-word edits, code), and
drafts where the text repeats.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine import decoding
from engine import events as ev
from engine.loader import load_model

# -- the real default model -------------------------------------------------------------


def default_model() -> Any:
    from engine.default_model import default_model_path, is_default_model_present

    if not is_default_model_present():
        pytest.skip("the default model is not downloaded (make model)")
    return load_model(default_model_path())


# One conversation's requests in order; every reply is compared, the last three are the
# ones speculation is for: a regenerate, an edit of one word, an edited code request.
REAL_REQUESTS = (
    "What causes the seasons on Earth? Answer in a short paragraph.",
    "What causes the seasons on Earth? Answer in a short paragraph.",
    "What causes the seasons on Mars? Answer in a short paragraph.",
    "Write a Python function is_prime(n) that checks whether n is prime.",
    "Write a Python function check_prime(n) that checks whether n is prime.",
)


@pytest.mark.real_model
def test_default_model_greedy_lookup_equals_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.session import Session

    # Always draft as long as allowed, uncut by lookup's confidence: the identity must hold
    # for every k, measured or not.
    monkeypatch.setattr(
        decoding, "best_draft_length", lambda _a, _c, available, *_: min(available, 8)
    )
    monkeypatch.setattr(decoding, "cut_draft", lambda draft, _costs, queued=False: draft)
    loaded = default_model()

    def replies(drafter: str) -> list[ev.Finished]:
        session = Session(loaded)  # plain and speculative see the same history
        out = []
        for question in REAL_REQUESTS:
            events: list[ev.Event] = []
            settings = ev.GenerationSettings(max_tokens=60, drafter=drafter)
            cmd = ev.Generate("r", (ev.Message("user", question),), settings)
            session.generate(cmd, events.append, lambda: False)
            out.append(next(e for e in events if isinstance(e, ev.Finished)))
        return out

    plain, spec = replies("off"), replies("lookup")
    for i, (p, s) in enumerate(zip(plain, spec, strict=True)):
        assert s.token_ids == p.token_ids, f"request {i}: {REAL_REQUESTS[i]!r}"
        assert p.stats is not None and s.stats is not None
        assert p.stats.drafted == 0
    regenerate = spec[1].stats
    assert regenerate is not None
    assert regenerate.accepted > 0.5 * regenerate.generated_tokens
    assert all(s.stats is not None and s.stats.accepted > 0 for s in spec[2:])
