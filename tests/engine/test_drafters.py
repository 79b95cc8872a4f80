"""Drafters: the suffix automaton against a brute-force matcher, cross-request lookup, and
the draft model's state staying exactly the committed context."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.drafters import DraftModelDrafter
from engine.loader import load_model
from engine.sequence import SequenceState, prefill
from engine.suffix_drafter import SuffixDrafter
from tests.conftest import TinyModel
from tests.hybrid_models import make_hybrid_dir

# -- SuffixDrafter ---------------------------------------------------------------------


class HistoryModel:
    """The drafter's history modelled without an automaton: every prefix of every path
    walked, with the time it was last stepped onto."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, ...], int] = {(): 0}
        self.clock = 0
        self.path: tuple[int, ...] = ()

    def begin(self, context: list[int]) -> None:
        self.path = ()
        self.commit(context)

    def commit(self, tokens: list[int]) -> None:
        for token in tokens:
            self.clock += 1
            self.path += (token,)
            self.seen[self.path] = self.clock

    def match(self, pending: int) -> tuple[int, list[tuple[int, ...]]]:
        """Longest suffix of path + [pending] that ends some stored prefix, and those
        prefixes (the occurrences' ends), most recent first."""
        text = (*self.path, pending)
        best: tuple[int, list[tuple[int, ...]]] = (0, [])
        for length in range(1, len(text) + 1):
            suffix = text[-length:]
            ends = [p for p in self.seen if p[-length:] == suffix and len(p) >= length]
            if not ends:  # a longer suffix contains this one, so it cannot occur either
                break
            best = (length, sorted(ends, key=self.seen.__getitem__, reverse=True))
        return best

    def continuation(self, end: tuple[int, ...], pending: int, k: int) -> list[int]:
        """Along the most recently stepped child; past the current path, pending and
        then the proposal itself."""
        out: list[int] = []
        node = end
        while len(out) < k:
            if node == self.path:  # the text read on: path + [pending] + the proposal
                while len(out) < k:
                    out.append([*self.path, pending, *out][len(end) + len(out)])
                break
            children = [p for p in self.seen if len(p) == len(node) + 1 and p[:-1] == node]
            if not children:
                break
            node = max(children, key=self.seen.__getitem__)
            out.append(node[-1])
        return out


@settings(max_examples=300, deadline=None)
@given(data=st.data(), exact=st.booleans(), min_match=st.integers(1, 3))
def test_suffix_drafter_matches_brute_force(data: st.DataObject, exact: bool, min_match: int):
    alphabet = st.integers(0, 2)
    drafter = SuffixDrafter(min_match=min_match, recency_depth=10**9 if exact else 2)
    model = HistoryModel()
    doc: list[int] = []
    for _ in range(data.draw(st.integers(1, 4))):
        how = data.draw(st.sampled_from(["fresh", "extend", "edit", "regenerate"]))
        extra = data.draw(st.lists(alphabet, max_size=8))
        if how == "extend":
            context = doc + extra
        elif how == "edit":
            context = doc[: data.draw(st.integers(0, len(doc)))] + extra
        elif how == "regenerate":
            context = doc[: data.draw(st.integers(0, len(doc)))]
        else:
            context = extra
        drafter.begin(context)
        model.begin(context)
        doc = context
        for _ in range(data.draw(st.integers(0, 6))):
            pending, k = data.draw(alphabet), data.draw(st.integers(1, 6))
            draft = drafter.propose(pending, k)
            length, ends = model.match(pending)
            assert drafter.match_length == length
            if length < min_match:
                assert draft.tokens == []
            else:
                options = [model.continuation(e, pending, k) for e in ends]
                if exact:  # an unbounded recency walk: the most recent occurrence exactly
                    assert draft.tokens == options[0]
                else:
                    assert draft.tokens in options
            committed = [pending] + data.draw(st.lists(alphabet, max_size=3))
            drafter.commit(committed)
            model.commit(committed)
            doc += committed
        drafter.end()
        assert drafter.path() == list(model.path)
        assert drafter.num_tokens == len(model.seen) - 1  # each distinct prefix once


def decode(drafter: SuffixDrafter, reply: list[int], k: int) -> list[list[int]]:
    """Feed `reply` one token at a time as a decode loop would; the proposals made."""
    proposals = []
    for token in reply:
        proposals.append(drafter.propose(token, k).tokens)
        drafter.commit([token])
    return proposals


def test_regenerate_after_edit_drafts_the_previous_answer():
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, 1000, 40)]
    reply = [int(t) for t in rng.integers(1000, 2000, 20)]
    drafter = SuffixDrafter()
    drafter.begin(prompt)
    decode(drafter, reply, k=8)
    drafter.end()

    edited = list(prompt)
    edited[10] = 5000  # a small edit well before the end
    drafter.begin(edited)
    proposals = decode(drafter, reply, k=8)
    for i, proposal in enumerate(proposals):
        assert proposal == reply[i + 1 : i + 9]
    assert drafter.match_length >= 30  # edited[11:] + the reply
    assert drafter.num_tokens == 40 + 20 + 30 + 20  # the shared first ten tokens once


def test_the_most_recent_branch_wins():
    prompt, first, second = [1, 2, 3, 4], [7, 8, 9, 10], [7, 11, 12, 13]
    drafter = SuffixDrafter()
    for reply in (first, second):
        drafter.begin(prompt)
        decode(drafter, reply, k=4)
        drafter.end()
    drafter.begin(prompt)
    assert drafter.propose(7, 4).tokens == [11, 12, 13]
    assert drafter.num_tokens == 4 + 4 + 3  # the prompt and the shared 7 once


def test_matches_stay_inside_paths():
    drafter = SuffixDrafter(min_match=2)
    drafter.begin([1, 2, 3])
    drafter.begin([7, 8])  # not an extension of [1, 2, 3]: a path of its own
    drafter.begin([3])
    # "3 7" only exists across two paths
    assert drafter.propose(7, 4).tokens == []
    assert drafter.match_length == 1
    drafter.begin([1, 2])
    # "1 2 3" ends its path: nothing follows it
    assert drafter.propose(3, 4).tokens == []
    assert drafter.match_length == 3


def test_next_turn_continues_the_path():
    drafter = SuffixDrafter()
    drafter.begin([1, 2, 3])
    drafter.commit([4, 5])
    drafter.end()
    drafter.begin([1, 2, 3, 4, 5, 6, 7])
    assert drafter.path() == [1, 2, 3, 4, 5, 6, 7]
    assert drafter.num_tokens == 7


def test_repeating_loop_drafts_past_the_end():
    drafter = SuffixDrafter()
    drafter.begin([5, 6, 5, 6])
    assert drafter.propose(5, 5).tokens == [6, 5, 6, 5, 6]


def test_suffix_drafter_rejects_bad_config_and_tokens():
    with pytest.raises(ValueError):
        SuffixDrafter(min_match=0)
    with pytest.raises(ValueError):
        SuffixDrafter(max_bytes=-1)
    with pytest.raises(ValueError):
        SuffixDrafter().begin([1, -3])
    drafter = SuffixDrafter()
    drafter.begin([1, 2])
    with pytest.raises(ValueError):
        drafter.commit([3, -1])
    with pytest.raises(ValueError):
        drafter.commit([1 << 32])
    with pytest.raises(ValueError):
        drafter.set_budget(-5)
    assert drafter.path() == [1, 2]
    assert drafter.num_tokens == 2


# -- DraftModelDrafter -----------------------------------------------------------------

DRAFT_MODELS = [("llama", "numpy"), ("llama", "mlx"), ("hybrid", "numpy")]
TOLERANCE = 1e-4


class CountingModel:
    """A model wrapper that counts the tokens forwarded."""

    def __init__(self, model) -> None:
        self.model, self.ops = model, model.ops
        self.num_forwarded = 0

    def new_state(self) -> SequenceState:
        return self.model.new_state()

    def forward(self, token_ids: list[int], state: SequenceState, logits: str = "last"):
        self.num_forwarded += len(token_ids)
        return self.model.forward(token_ids, state, logits)


@pytest.fixture(scope="module", params=DRAFT_MODELS)
def draft_model(request, tiny_llama_gguf: TinyModel, tmp_path_factory) -> CountingModel:
    family, backend = request.param
    if family == "hybrid":  # recurrent layers: propose's rollback restores snapshots
        path = tmp_path_factory.mktemp("hybrid") / "model"
        make_hybrid_dir(path)
    else:
        path = tiny_llama_gguf[0]
    # MLX in float32 on every device: assert_holds_exactly compares a draft state with a
    # fresh prefill at TOLERANCE, as the state tests do (tests/engine/test_state_property.py)
    dtype = "float32" if backend == "mlx" else None
    return CountingModel(load_model(path, EngineConfig(backend=backend, dtype=dtype)).runner)


def to_numpy(model, logits) -> np.ndarray:
    return np.asarray(model.ops.to_numpy(logits), dtype=np.float64)


def assert_holds_exactly(drafter: DraftModelDrafter, context: list[int], probe: int = 3):
    """The draft state is `context`, and its cache gives a fresh prefill's logits."""
    drafter.sync()  # begin and commit only queue tokens; propose and sync forward them
    model, state = drafter.model, drafter.state
    assert state.tokens == context
    cp = state.checkpoint()
    got = to_numpy(model, model.forward([probe], state))
    state.rollback(cp)
    fresh = model.new_state()
    want = to_numpy(model, prefill(model, fresh, context + [probe]))
    assert np.max(np.abs(got - want)) < TOLERANCE


def greedy_continuation(model, context: list[int], k: int) -> list[int]:
    state = model.new_state()
    logits = prefill(model, state, context)
    out = []
    for _ in range(k):
        out.append(int(np.argmax(to_numpy(model, logits)[-1])))
        logits = model.forward([out[-1]], state)
    return out


def test_draft_state_is_the_committed_context(draft_model: CountingModel):
    rng = np.random.default_rng(1)
    vocab = draft_model.model.config.vocab_size
    drafter = DraftModelDrafter(draft_model)
    context = [int(t) for t in rng.integers(0, vocab, 12)]
    drafter.begin(context)
    assert_holds_exactly(drafter, context)
    for _ in range(6):
        pending = int(rng.integers(0, vocab))
        draft = drafter.propose(pending, 4)
        assert draft.tokens == greedy_continuation(draft_model, context + [pending], 4)
        assert drafter.state.tokens == context
        committed = [pending] + draft.tokens[: int(rng.integers(0, 5))]
        drafter.commit(committed)
        context += committed
        assert_holds_exactly(drafter, context)
    drafter.end()

    # An edited branch: the drafter keeps the common prefix and forwards only the rest.
    edited = context[:9] + [int(t) for t in rng.integers(0, vocab, 5)]
    before = draft_model.num_forwarded
    drafter.begin(edited)
    if not drafter.state.needs_snapshots:  # (a hybrid replays from a snapshot at or before 9)
        assert draft_model.num_forwarded == before  # queued: forwarded at the first draft
    drafter.sync()
    if drafter.state.needs_snapshots:
        assert draft_model.num_forwarded - before <= len(edited)
    else:
        assert draft_model.num_forwarded - before == 5
    assert_holds_exactly(drafter, edited)
    drafter.begin(edited + [7, 8])
    assert_holds_exactly(drafter, edited + [7, 8])


def test_empty_draft_requests(draft_model: CountingModel):
    drafter = DraftModelDrafter(draft_model)
    drafter.begin([])
    assert drafter.propose(4, 0).tokens == []
    assert drafter.propose(4, 3).tokens == greedy_continuation(draft_model, [4], 3)
    assert drafter.state.tokens == []


def test_a_draft_model_not_asked_to_draft_forwards_nothing(draft_model: CountingModel):
    """A pool's member that does not pay costs nothing, not even the prompt; the first
    draft of a request forwards the prompt and says so (`setup_seconds`: the request's
    cost, not the draft's), and the draft is what an eager drafter gives."""
    drafter = DraftModelDrafter(draft_model)
    before = draft_model.num_forwarded
    prompt = list(range(3, 15))
    drafter.begin(prompt)
    drafter.commit([5, 6])
    drafter.end()
    context = prompt + [5, 6, 7]  # the next request shares the whole queue
    drafter.begin(context)
    drafter.end()
    assert draft_model.num_forwarded == before and drafter.state.tokens == []
    drafter.begin(context)
    first = drafter.propose(8, 2)
    assert first.tokens == greedy_continuation(draft_model, context + [8], 2)
    assert first.setup_seconds > 0 and drafter.state.tokens == context
    drafter.commit([8, *first.tokens[:1]])
    second = drafter.propose(9, 2)
    assert second.setup_seconds == 0.0
    assert second.tokens == greedy_continuation(draft_model, [*context, 8, first.tokens[0], 9], 2)
