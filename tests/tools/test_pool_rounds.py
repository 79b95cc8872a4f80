"""tools/drafter/pool_rounds.py on the default model, with and without `--rank-only`: every
row is a member of the block pool with no more accepted than drafted, lookup drafts only
where it had a match, a regenerate gives lookup rounds, and the pool is put back as it was
afterwards (the tool wraps its methods while it counts)."""

from __future__ import annotations

import pytest

from engine import decoding
from engine.default_model import is_default_model_present
from engine.drafter_pool import DrafterPool, Member, PoolAcceptance
from tools.drafter import pool_rounds

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(not is_default_model_present(), reason="the default model is not fetched"),
]


@pytest.mark.parametrize("rank_only", [False, True])
def test_rounds_are_counted_and_the_pool_is_restored(
    rank_only: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every round drafts 4: whether the cost model would draft at all is the machine's
    # measured costs' (on a GPU, where a block pass costs two queued steps, it may not)
    monkeypatch.setattr(
        decoding, "_choose_k", lambda req, _c, produced, *_: min(4, req.max_tokens - produced - 1)
    )
    originals = (DrafterPool.propose, PoolAcceptance.observe, Member.free)
    argv = ["--workload", "regenerate", "--max-tokens", "48"]
    result = pool_rounds.main(argv + (["--rank-only"] if rank_only else []))
    assert (DrafterPool.propose, PoolAcceptance.observe, Member.free) == originals
    rows = result["rows"]
    assert rows and result["rank_only"] is rank_only
    assert all(r["member"] in ("block", "lookup") and r["accepted"] <= r["drafted"] for r in rows)
    assert all(r["lookup_had_match"] for r in rows if r["member"] == "lookup")
    assert sum(r["rounds"] for r in rows if r["member"] == "lookup") > 0  # a regenerate copies
