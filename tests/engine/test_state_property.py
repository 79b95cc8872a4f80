"""Property test of the state contracts (docs/DESIGN.md, "State and rollback contracts").

Random sequences of operations (append in random chunks; checkpoint and a later rollback;
a recorded verify of m rows, ending on or crossing stride positions, then commit or
rollback_retaining; truncate to any earlier position; mark a snapshot; save + load; a
forward or a tape replay that fails half-way) on tiny random-weight models of three
kinds: Llama (full attention), Llama with a sliding window of 8 (ring slack 4, a snapshot
every 8 tokens, so deep rewinds need snapshots) and the Qwen3.5 hybrid (a snapshot every
8 tokens in a ring of 3, so eviction and the fallback to older snapshots or position 0
happen).

After EVERY operation the next-token logits equal a fresh prefill of the same tokens (and
so does every K/V row the state holds, row by row: with float16 K/V, the NumPy backend's
default, the logits' bound alone would let a wrong row at a long context through), the
stride snapshots are the ones the operations so far must have left (so a truncate replays
at most `stride` tokens wherever the ring's capacity allows), and an operation that was
refused (StateError) or failed (an injected error) leaves the state exactly as it was.
The helpers here are shared with the other state tests and test_state_io.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from engine.errors import StateError
from engine.loader import LoadedModel, load_model
from engine.sequence import prefill, truncate
from engine.state import SnapshotPolicy
from engine.state_io import load_state, save_state
from tests.conftest import TinyModels
from tests.engine.state_checks import (  # capture, assert_unchanged: shared from here too
    FORWARD_SITES,
    REPLAY_OPS,
    ExpectedStrides,
    SimulatedOOM,
    assert_unchanged,
    broken,
    capture,
    forward_site,
)
from tests.engine.state_reference import (  # token_ids, rows: shared from here too
    assert_close,
    assert_rows_match,
    fresh_prefill,
    probe_next_logits,
    rows,
    token_ids,
)
from tests.hybrid_models import make_hybrid_dir
from tests.tiny_models import VOCAB_SIZE
from tests.tolerances import engine_config

WINDOW, SLACK = 8, 4
POLICIES = {
    "llama": SnapshotPolicy(),
    "sliding": SnapshotPolicy(stride=8, stride_capacity=4, marked_capacity=2, sliding_slack=SLACK),
    "hybrid": SnapshotPolicy(stride=8, stride_capacity=3, marked_capacity=2),
}
MAX_TOKENS = 120  # keeps every fresh reference prefill cheap


# -- helpers shared by the state tests --------------------------------------------------


class StateModels:
    """The three tiny models per backend, each loaded once per session."""

    def __init__(self, tiny_models: TinyModels, root: Path) -> None:
        self.tiny_models, self.root = tiny_models, root
        self._loaded: dict[tuple[str, str], LoadedModel] = {}

    def path(self, kind: str) -> Path:
        if kind == "llama":
            return self.tiny_models.gguf(qtype="F32")[0]
        if kind == "sliding":
            return self.tiny_models.hf("llama", sliding_window=WINDOW)[0]
        if kind == "hybrid":
            path = self.root / "hybrid"
            if not path.exists():
                # eps 1e-3 (1e-5 elsewhere): at the first positions the gated output norm
                # divides by a tiny rms and amplifies float32 rounding between the chunked
                # and the recurrent kernel (1.7e-4 after one token with eps 1e-4, in an
                # example hypothesis found); state ops are unaffected
                make_hybrid_dir(path, "hf", rms_norm_eps=1e-3)
            return path
        raise ValueError(kind)

    def get(self, kind: str, backend: str = "numpy") -> LoadedModel:
        """MLX in float32 on every device: a state after any operations is compared with a
        fresh prefill of its tokens, whose chunks differ, so the two round differently; in
        float32 that stays within TOLERANCE, far below what one wrong row does. In bfloat16,
        a GPU's default, the rounding is as large as a wrong row's effect on the next logits:
        tests/engine/test_tolerances.py checks bfloat16 states row by row instead. 'numpy'
        keeps K/V in float16 (checked row by row too, `assert_rows_match`), 'numpy-float32'
        in float32. Other dtypes by name, as tests/tolerances.py's engine_config takes them
        ('mlx-bfloat16')."""
        if (kind, backend) not in self._loaded:
            config = engine_config("mlx-float32" if backend == "mlx" else backend)
            self._loaded[kind, backend] = load_model(self.path(kind), config)
        return self._loaded[kind, backend]


@pytest.fixture(scope="session")
def state_models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> StateModels:
    return StateModels(tiny_models, tmp_path_factory.mktemp("state_models"))


# -- the state machine -------------------------------------------------------------------


class StateOperations(RuleBasedStateMachine):
    """One model's state under random operations, checked against fresh prefills."""

    def __init__(self, loaded: LoadedModel, policy: SnapshotPolicy, tmp: Path) -> None:
        super().__init__()
        self.loaded, self.model, self.policy = loaded, loaded.model, policy
        self.state = self.model.new_state(policy)
        self.strides = ExpectedStrides(policy, self.state.needs_snapshots)
        self.has_sliding = any(t == "sliding_attention" for t in loaded.config.layer_types)
        self.file = tmp / "state.safetensors"
        self.cp: Any = None  # an open plain checkpoint, rolled back by a later rule
        self.cp_tokens: list[int] = []
        self.cp_stale = False  # a rewind happened since it was taken
        self.next_logits: np.ndarray | None = None  # from the last forward, if still current
        self.num_probes = 0

    def _rewound(self) -> None:
        self.cp_stale = self.cp is not None
        self.next_logits = None

    def _fails_and_changes_nothing(self, call: Any, target: Any, *names: str) -> bool:
        """Run `call` with `target.<names>` raising; whether it failed (else it needed none
        of them). A failure leaves the state exactly as it was, and usable."""
        before = capture(self.state)
        try:
            with broken(target, *names):
                call()
        except SimulatedOOM:
            assert not self.state.is_poisoned, "a failure that could be undone poisoned"
            assert_unchanged(before, self.state)
            return True
        return False

    @precondition(lambda self: self.state.offset <= MAX_TOKENS - 40)
    @rule(
        k=st.integers(1, 40),
        seed=st.integers(0, 2**16),
        chunk=st.sampled_from([3, 16, 512]),
        fail_at=st.sampled_from([None, None, *FORWARD_SITES]),
    )
    def append(self, k: int, seed: int, chunk: int, fail_at: str | None) -> None:
        start, ids = self.state.offset, token_ids(seed, k)
        if fail_at is not None:  # a forward dies half-way: its chunk is undone
            forward = lambda: self.model.forward(ids[:chunk], self.state, logits="none")  # noqa: E731
            assert self._fails_and_changes_nothing(forward, *forward_site(self.model, fail_at))
            event("forward failed and was undone")
        logits = prefill(self.model, self.state, ids, chunk_size=chunk)
        self.strides.passed(start, self.state.offset)
        self.next_logits = rows(logits)[-1]

    @precondition(lambda self: self.cp is None)
    @rule()
    def take_checkpoint(self) -> None:
        self.cp = self.state.checkpoint()
        self.cp_tokens = list(self.state.tokens)
        self.cp_stale = False

    @precondition(lambda self: self.cp is not None)
    @rule()
    def rollback_to_checkpoint(self) -> None:
        before = capture(self.state)
        depth = self.state.offset - self.cp.position
        try:
            self.state.rollback(self.cp)
        except StateError:
            assert self.cp_stale or (self.has_sliding and depth > SLACK), "refused needlessly"
            assert_unchanged(before, self.state)
            event("rollback refused: " + ("stale" if self.cp_stale else "deeper than the ring"))
        else:
            assert self.state.tokens == self.cp_tokens
            self.strides.rewound(self.cp.position)
            self._rewound()
            event("rollback exact")
        self.cp = None

    @precondition(lambda self: self.state.offset <= MAX_TOKENS - 8)
    @rule(
        m=st.integers(1, 8),
        keep=st.integers(0, 8),
        seed=st.integers(0, 2**16),
        accept_all=st.booleans(),
        place=st.sampled_from(["anywhere", "ending on a stride", "across a stride"]),
        fault=st.sampled_from([None, None, "in the forward", "in the replay"]),
        site=st.sampled_from(FORWARD_SITES),
    )
    def verify(
        self, m: int, keep: int, seed: int, accept_all: bool, place: str, fault: Any, site: str
    ) -> None:
        start = self.state.offset
        to_stride = self.policy.stride - start % self.policy.stride
        if place == "ending on a stride":
            m = min(8, to_stride)
        elif place == "across a stride":  # the stride position lies inside the verify
            m = min(8, to_stride + 1 + m % 3)
        ids = token_ids(seed, m)
        cp = self.state.checkpoint(record=True)
        if fault == "in the forward":
            forward = lambda: self.model.forward(ids, self.state, logits="all")  # noqa: E731
            assert self._fails_and_changes_nothing(forward, *forward_site(self.model, site))
            assert self.state.recording is cp
            event("verify: forward failed, the recording stays open")
        verified = rows(self.model.forward(ids, self.state, logits="all"))
        if (
            self.state.needs_snapshots
            and start < (start // self.policy.stride + 1) * (self.policy.stride) <= start + m
        ):
            event(f"verify {place}: its rows reach a stride position")
        if accept_all:
            self._close(lambda: self.state.commit(cp), fault == "in the replay")
            self.strides.passed(start, start + m)
            self.next_logits = verified[-1]
            event("verify: commit")
            return
        keep = min(keep, m)
        before = capture(self.state)
        try:
            self._close(lambda: self.state.rollback_retaining(cp, keep), fault == "in the replay")
        except StateError:
            assert self.has_sliding and m - keep > SLACK, "retaining rollback refused needlessly"
            assert_unchanged(before, self.state)
            # what the decoder does then: accept the rows and truncate, exact from a snapshot
            self.state.commit(cp)
            self.strides.passed(start, start + m)
            self._truncate(cp.position + keep, chunk=512)
            self._rewound()
            event("verify: retaining refused, commit + truncate")
        else:
            self.strides.passed(start, start + keep)
            self._rewound()
            event("verify: retaining rollback")
            self.next_logits = verified[keep - 1] if keep else None
        assert self.state.offset == cp.position + keep

    def _close(self, call: Any, replay_fails: bool) -> None:
        """Commit or retain; with `replay_fails`, first with the tape replay failing."""
        if replay_fails:
            if not self._fails_and_changes_nothing(call, self.model.ops, *REPLAY_OPS):
                event("verify: closed without a replay")
                return
            assert self.state.is_recording
            event("verify: replay failed, the verify stays open")
        call()

    def _truncate(self, n: int, chunk: int) -> int:
        start = self.state.plan_truncate(n)
        truncate(self.model, self.state, n, chunk_size=chunk)
        self.strides.rewound(start)
        self.strides.passed(start, n)
        return start

    @rule(data=st.data(), chunk=st.sampled_from([5, 512]))
    def truncate_to(self, data: st.DataObject, chunk: int) -> None:
        n = data.draw(st.integers(0, self.state.offset), label="n")
        start = self.state.plan_truncate(n)
        assert start == n or start == 0 or start in self.state.snapshot_positions()
        assert start <= n
        if not self.state.needs_snapshots:
            assert start == n, "full attention rewinds by moving the cursor"
        event(
            "truncate " + ("direct" if start == n else "from 0" if not start else "from a snapshot")
        )
        offset = self.state.offset
        self._truncate(n, chunk)
        assert self.state.offset == n
        if n < offset:
            self._rewound()

    @rule()
    def mark(self) -> None:
        assert self.state.mark(self.state.offset)

    @precondition(lambda self: self.state.offset > 0)
    @rule()
    def save_and_load(self) -> None:
        save_state(self.state, self.file, self.loaded.fingerprint)
        reloaded = load_state(self.model, self.file, self.loaded.fingerprint)
        before = capture(self.state)
        after = capture(reloaded)
        assert after.tokens == before.tokens and after.lengths == before.lengths
        assert after.snapshot_positions == before.snapshot_positions
        for was, now in zip(before.arrays, after.arrays, strict=True):
            assert all(np.array_equal(was[k], now[k]) for k in was)
        self.state = reloaded
        self.cp = None  # checkpoints belong to the state object they were taken on

    @invariant()
    def a_truncate_replays_at_most_a_stride(self) -> None:
        held = [pos for store, pos, _ in self.state.snapshot_items() if store == "stride"]
        assert held == self.strides.held, "stride snapshots missing or not asked for"
        for n in range(self.state.offset + 1):
            assert self.state.plan_truncate(n) >= self.strides.newest_at_or_before(n)

    @invariant()
    def next_logits_equal_a_fresh_prefill(self) -> None:
        # first, before a probe's rollback would forget snapshots past the tokens
        assert all(pos <= self.state.offset for pos in self.state.snapshot_positions())
        assert not self.state.is_recording and not self.state.is_poisoned
        tokens = list(self.state.tokens)
        if self.cp is not None and not self.cp_stale and self.next_logits is not None:
            # a probe is a rollback and would make the open checkpoint stale
            fresh, want = fresh_prefill(self.model, self.policy, tokens)
            assert_close(self.model, self.next_logits, want, f"last logits of {len(tokens)} tokens")
            assert_rows_match(self.model, self.state, fresh)
            return
        probe = (len(tokens) * 31 + self.num_probes) % VOCAB_SIZE
        self.num_probes += 1
        got = probe_next_logits(self.model, self.state, probe)
        self.strides.probed(len(tokens))
        self.cp_stale = self.cp is not None  # the probe rolled back to here: same logits
        assert self.state.tokens == tokens
        fresh, want = fresh_prefill(self.model, self.policy, [*tokens, probe])
        assert_close(self.model, got, want, f"next logits after {len(tokens)} tokens")
        assert_rows_match(self.model, self.state, fresh)


CASES = [  # (model kind, backend, examples, steps): the whole file runs in about a minute
    ("llama", "numpy", 30, 25),  # float16 K/V, the NumPy backend's default
    ("sliding", "numpy", 40, 30),
    ("hybrid", "numpy", 40, 30),
    ("llama", "numpy-float32", 10, 25),
    ("sliding", "numpy-float32", 15, 30),
    ("sliding", "mlx", 6, 20),
    ("hybrid", "mlx", 6, 20),
]


@pytest.mark.parametrize(("kind", "backend", "examples", "steps"), CASES)
def test_random_operations_match_fresh_prefill(
    state_models: StateModels, tmp_path: Path, kind: str, backend: str, examples: int, steps: int
) -> None:
    loaded = state_models.get(kind, backend)
    run_state_machine_as_test(
        lambda: StateOperations(loaded, POLICIES[kind], tmp_path),
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
