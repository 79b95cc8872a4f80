"""The block drafter (engine/block_drafter.py): speculation with it never changes the output
(greedy and seeded sampling, full-attention and hybrid targets, both backends), its
context rows are the target's and nothing else, and a file that does not fit is refused
by name."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import block_pass_cpu
from engine.block_drafter import BlockDrafter, CapturingForward
from engine.block_pass_cpu import CpuPass
from engine.drafter_file import BlockDrafterWeights
from engine.errors import ModelLoadError, StateError
from engine.sampling import SamplingSettings
from engine.sequence import prefill
from tests.block_drafters import drafter_tensors, write_drafter
from tests.engine import test_speculative
from tests.engine.test_speculative import (
    Case,
    Pair,
    RandomK,
    assert_exact,
    assert_holds_output,
    run,
)

pair = test_speculative.pair
cases = test_speculative.cases
random_k = test_speculative.random_k

SIGNATURE = "a-test-signature"


def make_drafter(target: Any, tmp_path: Path, **kwargs: Any) -> BlockDrafter:
    path = write_drafter(tmp_path / "drafter.safetensors", target.config, SIGNATURE, **kwargs)
    return BlockDrafter(BlockDrafterWeights(path, target.model, SIGNATURE), target.model)


# a greedy and a seeded sampled request: the two ways speculation must stay exact
greedy_and_sampled = pytest.mark.parametrize(
    "settings",
    [SamplingSettings(seed=0), SamplingSettings(temperature=1.1, top_p=0.95, seed=5)],
    ids=["greedy", "sampled"],
)


@greedy_and_sampled
def test_block_drafter_never_changes_the_output(
    pair: Pair, cases: list[Case], random_k: RandomK, tmp_path: Path, settings: SamplingSettings
) -> None:
    """Random draft lengths every step, drafts from a random drafter over the whole tiny
    vocabulary: every reply is plain decoding's, and the state holds exactly it."""
    drafter = make_drafter(pair.target, tmp_path, block=9)
    assert_speculation_exact(pair.target, drafter, cases[:4], random_k, settings)


@greedy_and_sampled
def test_speculation_with_the_pass_in_one_call_never_changes_the_output(
    pair: Pair, cases: list[Case], random_k: RandomK, tmp_path: Path, settings: SamplingSettings
) -> None:
    """The engine's own pass: traced on MLX (engine/block_pass_mlx.py), one C call on NumPy
    (engine/block_pass_cpu.py)."""
    target = pair.target
    path = write_drafter(tmp_path / "drafter.safetensors", target.config, SIGNATURE, block=9)
    weights = BlockDrafterWeights(path, target.model, SIGNATURE)
    if pair.backend == "mlx":
        drafter = BlockDrafter(weights, target.model, True)
        assert drafter.compiled is not None
    else:
        if block_pass_cpu.unsupported_reason(weights, target.ops):
            pytest.skip(block_pass_cpu.unsupported_reason(weights, target.ops))
        drafter = BlockDrafter(weights, target.model, False, CpuPass(weights, target.ops))
    assert_speculation_exact(target, drafter, cases[:3], random_k, settings)


def assert_speculation_exact(
    target: Any, drafter: BlockDrafter, cases: list[Case], random_k: RandomK, settings: Any
) -> None:
    """Each case decoded plainly and with `drafter` at random draft lengths (its seed moved
    per case): the same reply and reason, the state holding exactly it, the drafter's rows
    covering the committed context; and some tokens were drafted."""
    drafted = 0
    for i, case in enumerate(cases):
        seeded = dataclasses.replace(settings, seed=settings.seed + i)
        plain, _ = run(target, case.prompt, case.max_tokens, settings=seeded)
        random_k.restart()
        result, state = run(target, case.prompt, case.max_tokens, drafter, seeded)
        assert result.token_ids == plain.token_ids, f"prompt {i}"
        assert result.reason == plain.reason
        assert_holds_output(state, case.prompt, result)
        assert_exact(target, state, case.prompt)
        assert drafter.cursor == len(drafter.tokens) == len(state.tokens)
        drafted += result.drafted
    assert drafted > 0


def fresh_rows(target: Any, tokens: list[int], stepped: int = 0) -> np.ndarray:
    """The target's last-layer rows of `tokens` from a fresh prefill, the last `stepped` of
    them decoded one at a time after it (plain decoding's rows)."""
    got: list[np.ndarray] = []
    capture = CapturingForward(target, lambda start, rows: got.append(target.ops.to_numpy(rows)))
    state = target.new_state()
    prefill(capture, state, tokens[: len(tokens) - stepped])
    for token in tokens[len(tokens) - stepped :]:
        capture.forward([token], state)
    return np.concatenate(got)


def test_context_rows_after_decoding_equal_a_fresh_prefill(
    pair: Pair, cases: list[Case], random_k: RandomK, tmp_path: Path
) -> None:
    """After a reply with partial accepts, the drafter's next block equals the block of a
    drafter given the whole context's rows at once: no draft row and no rolled-back verify
    row stayed in its context."""
    drafter = make_drafter(pair.target, tmp_path)
    case = cases[0]
    result, state = run(pair.target, case.prompt, case.max_tokens, drafter)
    assert result.drafted > result.accepted  # some drafts were rejected
    pending = result.token_ids[-1]
    got = pair.target.ops.to_numpy(drafter.block_logits(pending, 5))

    # bfloat16 (a GPU): the fused step's rows round unlike a prefill's MLX matmuls, and a
    # hybrid's recurrence carries that from step to step, so the rows to match are plain
    # decoding's (the reply's tokens one step each), against which one wrong row is far off
    float32 = "float32" in str(pair.target.ops.dtype)
    stepped = 0 if float32 else len(state.tokens) - len(case.prompt)

    def block_after(tokens: list[int]) -> np.ndarray:
        other = make_drafter(pair.target, tmp_path)
        other.begin(tokens)
        other.observe_hidden(fresh_rows(pair.target, tokens, stepped), 0)
        return np.asarray(pair.target.ops.to_numpy(other.block_logits(pending, 5)), np.float64)

    want = block_after(list(state.tokens))
    if float32:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    else:
        wrong = block_after(
            [*state.tokens[:-1], (state.tokens[-1] + 1) % pair.target.config.vocab_size]
        )
        assert np.linalg.norm(got - want) < 0.5 * np.linalg.norm(wrong - want)


def test_a_shorter_block_drafts_the_first_rows_of_a_longer_one(pair: Pair, tmp_path: Path) -> None:
    """Causal inside the block: k + 1 rows give the first k rows of any longer pass."""
    drafter = make_drafter(pair.target, tmp_path, block=9)
    tokens = list(range(3, 20))
    drafter.begin(tokens)
    drafter.observe_hidden(fresh_rows(pair.target, tokens), 0)
    ops = pair.target.ops
    long = ops.to_numpy(drafter.block_logits(7, 8))
    for k in (1, 3, 5):
        np.testing.assert_allclose(
            ops.to_numpy(drafter.block_logits(7, k)), long[:k], rtol=1e-5, atol=1e-5
        )


def test_drafts_come_from_the_draft_vocabulary(pair: Pair, tmp_path: Path) -> None:
    drafter = make_drafter(pair.target, tmp_path, vocab=7, seed=3)
    tokens = list(range(3, 30))
    drafter.begin(tokens)
    drafter.observe_hidden(fresh_rows(pair.target, tokens), 0)
    draft = drafter.propose(5, 8)
    assert len(draft.tokens) == 7  # block 8: at most 7 drafts
    assert set(draft.tokens) <= set(drafter.w.vocab.tolist())


def test_a_draft_carries_the_running_product_of_its_rows_top_probabilities(
    pair: Pair, tmp_path: Path
) -> None:
    """What the decode loop cuts a draft by (decoding.cut_draft): row j's entry is the
    product of rows 1..j's top-1 probabilities under the block's own logits, greedy or
    sampled alike (it never reads the drawn tokens)."""
    drafter = make_drafter(pair.target, tmp_path, vocab=7, seed=3)
    tokens = list(range(3, 30))
    drafter.begin(tokens)
    drafter.observe_hidden(fresh_rows(pair.target, tokens), 0)
    logits = np.asarray(pair.target.ops.to_numpy(drafter.block_logits(5, 6)), np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    want = np.cumprod(probs.max(-1) / probs.sum(-1))
    greedy = drafter.propose(5, 6)
    drafter.couple(lambda row, history: int(np.flatnonzero(np.isfinite(row))[-1]))
    sampled = drafter.propose(5, 6)
    assert sampled.tokens != greedy.tokens  # the coupled sampler drew other tokens
    for draft in (greedy, sampled):
        np.testing.assert_allclose(draft.confidence, want, rtol=1e-4)
    assert 0 < want[-1] < want[0] <= 1


def test_drafting_from_missing_or_stale_rows_fails_loudly(pair: Pair, tmp_path: Path) -> None:
    drafter = make_drafter(pair.target, tmp_path)
    tokens = list(range(3, 20))
    drafter.begin(tokens)
    with pytest.raises(StateError, match="stale rows"):  # the prompt's rows never came
        drafter.propose(5, 3)
    rows = fresh_rows(pair.target, [*tokens, 5, 6])
    drafter.observe_hidden(rows[:-2], 0)
    assert drafter.propose(5, 3).tokens
    drafter.observe_hidden(rows[-2:-1])
    with pytest.raises(StateError, match="capture was missed"):  # two tokens, one row
        drafter.commit([5, 6])


def test_a_new_request_keeps_the_rows_of_the_shared_prefix(pair: Pair, tmp_path: Path) -> None:
    drafter = make_drafter(pair.target, tmp_path)
    tokens = list(range(3, 25))
    rows = fresh_rows(pair.target, tokens)
    drafter.begin(tokens)
    drafter.observe_hidden(rows, 0)
    drafter.end()
    edited = tokens[:15] + [40, 41]
    drafter.begin(edited)
    assert drafter.cursor == 15  # the rows after the edit point are gone
    with pytest.raises(StateError):
        drafter.propose(5, 2)
    drafter.observe_hidden(fresh_rows(pair.target, edited)[15:], 15)
    assert drafter.cursor == len(edited)
    # a gap (rows of a far later start): the context restarts there
    drafter.begin(tokens)
    drafter.observe_hidden(rows[20:], 20)
    assert (drafter.base, drafter.cursor) == (20, len(tokens))
    assert drafter.propose(5, 2).tokens


@pytest.fixture
def target(pair: Pair) -> Any:
    return pair.target


def test_files_that_do_not_fit_are_refused_by_name(target: Any, tmp_path: Path) -> None:
    cfg = target.config
    good = drafter_tensors(cfg)

    def refused(match: str, **kwargs: Any) -> None:
        path = write_drafter(tmp_path / "bad.safetensors", cfg, SIGNATURE, **kwargs)
        with pytest.raises(ModelLoadError, match=match) as info:
            BlockDrafterWeights(path, target.model, SIGNATURE)
        assert "bad.safetensors" in str(info.value)

    refused("not a branchchat-block-drafter file", metadata={"format": "something-else"})
    refused("version 1", metadata={"version": "2"})
    refused("not this model", metadata={"target_check": "another model's"})
    # rows of two layers (training's --taps) need fc of 2 * D columns
    two = f"0,{cfg.num_layers - 1}"
    refused(r"'fc.weight' is .*, this target needs", metadata={"target_layers": two})
    wide = dict(good, **{"fc.weight": np.zeros((cfg.hidden_size, cfg.hidden_size + 1), np.float32)})
    refused("'fc.weight' is", tensors=wide)
    refused(
        "'layers.0.q_proj.weight' is missing",
        tensors={k: v for k, v in good.items() if "q_proj" not in k},
    )
    refused("does not use", tensors=dict(good, extra=np.zeros(3, np.float32)))
    far = dict(good, vocab=np.array([0, cfg.vocab_size], np.int32))
    refused("outside this target's vocabulary", tensors=far)
    refused("'layers' is missing", metadata={"layers": ""})
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ModelLoadError, match="corrupt"):
        BlockDrafterWeights(corrupt, target.model, SIGNATURE)
    with pytest.raises(ModelLoadError, match="no block drafter file"):
        BlockDrafterWeights(tmp_path / "absent.safetensors", target.model, SIGNATURE)


def test_the_engine_drafts_with_it_and_replies_as_plain_decoding(
    tiny_models: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the engine: Block drafts and replies exactly as drafting off and Auto do,
    greedy and seeded."""
    from engine import events as ev
    from engine.config import EngineConfig
    from engine.drafter_file import target_signature
    from engine.loader import load_model
    from tests.engine.engine_runner import Runner, always_draft, user

    always_draft(monkeypatch)
    model_path = tiny_models.gguf(qtype="F32", seed=0)[0]
    loaded = load_model(model_path, EngineConfig(backend="numpy"))
    signature = target_signature(loaded.config, loaded.tokenizer)
    drafter_path = write_drafter(tmp_path / "d.safetensors", loaded.config, signature, block=6)
    messages = (user("The sea is blue and the sky is wide. The sea is blue and"),)
    with Runner(block_drafter=str(drafter_path)) as runner:
        runner.engine.submit(ev.LoadModel(str(model_path)))
        while not isinstance(event := runner.next_event(), ev.ModelLoaded):
            assert not isinstance(event, ev.Failed), event
        for sampling in (SamplingSettings(seed=1), SamplingSettings(temperature=0.9, seed=2)):
            replies = {}
            for drafter in ("off", "block", "auto"):
                settings = ev.GenerationSettings(sampling, max_tokens=20, drafter=drafter)
                finished = runner.generate(messages, settings)
                assert finished.stats is not None
                if drafter == "block":
                    assert finished.stats.drafted > 0
                replies[drafter] = finished.token_ids
            assert replies["block"] == replies["off"] == replies["auto"]


def test_a_drafter_for_another_model_is_reported_and_the_model_still_answers(
    tiny_models: Any, tmp_path: Path
) -> None:
    from engine import events as ev
    from engine.config import EngineConfig
    from engine.loader import load_model
    from tests.engine.engine_runner import Runner, user

    model_path = tiny_models.gguf(qtype="F32", seed=0)[0]
    cfg = load_model(model_path, EngineConfig(backend="numpy")).config
    drafter_path = write_drafter(tmp_path / "other.safetensors", cfg, "another model's")
    with Runner(block_drafter=str(drafter_path)) as runner:
        runner.engine.submit(ev.LoadModel(str(model_path)))
        events = []
        while not isinstance(event := runner.next_event(), ev.Failed):
            events.append(event)
        assert "other.safetensors" in event.message and "not this model" in event.message
        assert any(isinstance(e, ev.ModelLoaded) for e in events)
        settings = ev.GenerationSettings(SamplingSettings(seed=0), max_tokens=5, drafter="block")
        with pytest.raises(AssertionError, match="not this model"):
            runner.generate((user("hello"),), settings)
        assert runner.generate(
            (user("hello"),), ev.GenerationSettings(SamplingSettings(seed=0), max_tokens=5)
        ).token_ids


def test_a_model_without_a_shipped_drafter_gets_none_quietly(tiny_models: Any) -> None:
    """The shipped file names the default model: another model loads without it (the
    reason is kept for a request that asks for the block drafter; nothing is reported at
    load for a drafter nobody asked for)."""
    from engine.block_drafter_load import load_block_drafter
    from engine.config import EngineConfig
    from engine.loader import load_model

    lm = load_model(tiny_models.gguf(qtype="F32", seed=0)[0], EngineConfig(backend="numpy"))
    drafter, problem = load_block_drafter(None, lm)
    assert drafter is None and "has no block drafter" in problem
    assert load_block_drafter("off", lm)[0] is None


def test_a_bfloat16_file_is_refused_by_name(target: Any, tmp_path: Path) -> None:
    """The format stores float16 or float32: a bfloat16 tensor is named, not misread."""
    import mlx.core as mx

    from tests.block_drafters import drafter_metadata

    cfg = target.config
    arrays = {k: mx.array(v) for k, v in drafter_tensors(cfg).items()}
    arrays["fc.weight"] = arrays["fc.weight"].astype(mx.bfloat16)
    path = tmp_path / "bf16.safetensors"
    mx.save_safetensors(str(path), arrays, drafter_metadata(cfg, SIGNATURE, 1, 32, 8))
    with pytest.raises(ModelLoadError, match="bf16.safetensors.*type this format does not use"):
        BlockDrafterWeights(path, target.model, SIGNATURE)


def test_sessions_on_one_model_share_its_weights_not_its_rows(
    tiny_models: Any, tmp_path: Path
) -> None:
    """A second session on the same loaded model reuses the drafter's weights (Q8_0
    rounding and the target's check are not redone) with rows of its own; a file
    rewritten since is read again."""
    import os

    from engine.block_drafter_load import load_block_drafter
    from engine.config import EngineConfig
    from engine.drafter_file import target_signature
    from engine.loader import load_model

    loaded = load_model(tiny_models.gguf(qtype="F32", seed=0)[0], EngineConfig(backend="numpy"))
    signature = target_signature(loaded.config, loaded.tokenizer)
    path = write_drafter(tmp_path / "d.safetensors", loaded.config, signature, block=6)
    first, problem = load_block_drafter(str(path), loaded)
    second, _ = load_block_drafter(str(path), loaded)
    assert problem == "" and first is not None and second is not None
    assert second.w is first.w and second.kv is not first.kv
    first.begin([1, 2, 3])
    first.observe_hidden(np.ones((3, loaded.config.hidden_size), dtype=np.float32), 0)
    assert first.cursor == 3 and second.cursor == 0
    write_drafter(path, loaded.config, signature, block=6, seed=1)
    os.utime(path, ns=(1, 1))  # another version of the file, whatever the clock's grain
    third, _ = load_block_drafter(str(path), loaded)
    assert third is not None and third.w is not first.w
