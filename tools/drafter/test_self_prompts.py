"""Prompts the target writes itself, and the chunked generation (torch:
/tmp/tvenv/bin/python -m pytest -q tools/drafter): sampled turns are decoded text that
ended at the end-of-turn token, no held-out turn passes, and a killed call resumes
without losing or repeating work."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from tools.drafter import data, generate, prompt_seeds, self_prompts
from tools.drafter.prompts import load_heldout, render_ids

MODEL = Path.home() / ".cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(not MODEL.exists(), reason="the default model is not fetched")
SMALL = {"chunk": 4, "batch_size": 4, "max_turn_tokens": 40, "seed": 3}


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def model():
    from tools.drafter.target import Target

    return Target(MODEL, "cpu"), self_prompts.load_tokenizer(MODEL)


@pytest.fixture(scope="module")
def whole(model, tmp_path_factory):
    target, tokenizer = model
    state = tmp_path_factory.mktemp("whole")
    return self_prompts.sample_prompts(target, tokenizer, 6, state, **SMALL)


def test_sampled_prompts_are_decoded_turns_that_ended_at_end_of_turn(model, whole):
    _, tokenizer = model
    end = tokenizer.token_to_id("<|im_end|>")
    assert len(whole) == 6
    for r in whole:
        turn = r["turn_ids"]
        assert turn[-1] == end and end not in turn[:-1]
        text = r["messages"][-1]["content"]
        assert r["messages"][-1]["role"] == "user" and text == text.strip() and text
        assert (r["opener"] + tokenizer.decode(turn[:-1])).strip() == text
        assert r["ids"] == render_ids(tokenizer, r["messages"])  # rendered as prompts.py does
        rendered = tokenizer.decode(r["ids"])
        assert rendered.endswith(text + "<|im_end|>\n<|im_start|>assistant\n")


def test_a_killed_call_resumes_without_duplicates(model, whole, tmp_path, monkeypatch):
    target, tokenizer = model
    original = self_prompts.sample_chunk

    def dies_at_chunk_1(*args, **kwargs):
        if args[3] == 1:
            raise Killed
        return original(*args, **kwargs)

    monkeypatch.setattr(self_prompts, "sample_chunk", dies_at_chunk_1)
    with pytest.raises(Killed):
        self_prompts.sample_prompts(target, tokenizer, 6, tmp_path, **SMALL)
    first = (tmp_path / "chunk_00000.json").read_text()
    assert sorted(p.name for p in tmp_path.glob("chunk_*")) == ["chunk_00000.json"]
    calls = []
    monkeypatch.setattr(self_prompts, "sample_chunk", lambda *a, **k: calls.append(a[3]) or
                        original(*a, **k))  # fmt: skip
    resumed = self_prompts.sample_prompts(target, tokenizer, 6, tmp_path, **SMALL)
    assert 0 not in calls  # chunk 0 was read back, not sampled again
    assert (tmp_path / "chunk_00000.json").read_text() == first
    turns = [self_prompts.normalise(r["messages"][-1]["content"]) for r in resumed]
    assert len(set(turns)) == len(turns) == 6
    assert resumed == whole  # as if it had never stopped
    save = tmp_path / "self.npz"
    self_prompts.save_prompts(resumed, save, tokenizer.vocab_size)
    loaded = data.load_prompts(save)
    assert [list(p) for p in loaded] == [r["ids"] for r in resumed]
    with np.load(save) as f:
        assert [json.loads(m) for m in f["messages"]] == [r["messages"] for r in resumed]
    with pytest.raises(ValueError, match="other settings"):
        self_prompts.sample_prompts(target, tokenizer, 6, tmp_path, **{**SMALL, "seed": 4})


def test_no_held_out_turn_passes(model, monkeypatch):
    _, tokenizer = model
    end = tokenizer.token_to_id("<|im_end|>")
    held = [m["content"] for chat in load_heldout() for m in chat if m["role"] == "user"]
    variants = held + [h.upper() for h in held] + ["  " + h.replace(" ", "  ") for h in held]
    replies = iter(variants * 4)

    def fake_batch(target, prompts, *args):  # every "sampled" turn is a held-out one
        return [np.array(tokenizer.encode(next(replies)) + [end]) for _ in prompts]

    monkeypatch.setattr(generate, "_generate_batch", fake_batch)
    monkeypatch.setattr(prompt_seeds, "SHARES", {"open": 1.0})  # no opener before them
    flt = self_prompts.Filter(tokenizer, end, 200, self_prompts.heldout_turns())
    logged = []
    options = {"temperature": 1.0, "top_p": 0.95, "seed": 0, "log": logged.append}
    kept = self_prompts.sample_chunk(
        None, tokenizer, flt, 0, chunk=len(variants), batch_size=8, **options
    )
    assert kept == [] and f"{{'held-out': {len(variants)}}}" in logged[0]
    # the filter's other reasons, and a fresh turn that passes once
    seed = prompt_seeds.Seed("open", (), None, "")
    fresh = tokenizer.encode("How do owls see at night?")
    assert flt.why_dropped(seed, fresh + [end])[0] == "ok"
    assert flt.why_dropped(seed, fresh + [end]) == "duplicate"
    other = tokenizer.encode("Why is the sea salty?")
    assert flt.why_dropped(seed, other) == "over-long"  # never ended
    assert flt.why_dropped(seed, other + [0]) == "other stop token"
    assert flt.why_dropped(seed, other[:1] + [1] + other[1:] + [end]) == "special token"
    assert flt.why_dropped(seed, tokenizer.encode(" \n") + [end]) == "empty"
    assert flt.why_dropped(seed, other + [end])[0] == "ok"
    # a held-out turn is refused after any opener too
    opener = prompt_seeds.Seed("opener", (), None, held[0][:10])
    rest = tokenizer.encode(held[0][10:])
    assert flt.why_dropped(opener, rest + [end]) == "held-out"


def test_seeds_cover_every_kind_and_render_up_to_a_user_turn(model):
    _, tokenizer = model
    rng = random.Random(0)
    seeds = [prompt_seeds.draw_seed(rng) for _ in range(300)]
    assert {s.kind for s in seeds} == set(prompt_seeds.SHARES)
    for s in seeds[:40]:
        text = tokenizer.decode(self_prompts.sampling_prefix(tokenizer, s))
        assert text.endswith("<|im_start|>user\n" + s.opener)
        if s.steer:
            assert s.steer in text


def test_generation_resumes_after_a_kill(model, tmp_path, monkeypatch):
    target, _ = model
    prompts = data.load_prompts(Path(generate.__file__).parent / "prompts.npz")[:5]
    options = {"max_new_tokens": 5, "batch_size": 2, "passes": [2, 1, 1, 1, 2],
               "greedy_every": 4, "seed": 0, "chunk": 2, "log": lambda *_: None}  # fmt: skip
    whole = generate.generate_replies(target, prompts, **options)
    original, calls = generate._generate_chunk, []

    def dies_at_second(*args):
        calls.append(args[-1])
        if len(calls) == 2:
            raise Killed
        return original(*args)

    monkeypatch.setattr(generate, "_generate_chunk", dies_at_second)
    with pytest.raises(Killed):
        generate.generate_replies(target, prompts, state=tmp_path, **options)
    assert [p.name for p in tmp_path.glob("chunk_*")] == ["chunk_00000.npz"]
    resumed = generate.generate_replies(target, prompts, state=tmp_path, **options)
    assert calls.count(0) == 1  # chunk 0 was not generated again
    for name in data.Sequences.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(resumed, name), getattr(whole, name))
    plan = generate._plan(5, options["passes"], 4)
    assert len(resumed) == len(plan) == 7  # each planned reply once
    assert sorted(resumed.prompt_index) == sorted(i for i, _ in plan)
    assert sorted(resumed.sampled) == sorted(t > 0 for _, t in plan)
    deadline = generate.generate_replies(target, prompts, state=tmp_path / "late", deadline=0,
                                         **options)  # fmt: skip
    assert deadline is None and not list((tmp_path / "late").glob("chunk_*"))
    with pytest.raises(ValueError, match="other settings"):
        generate.generate_replies(target, prompts, state=tmp_path, **{**options, "seed": 1})


def test_a_grown_set_repeats_no_turn_of_the_earlier_one(model, whole, tmp_path, monkeypatch):
    """GROW's prompts (`--avoid` the carried file): a turn sampled again is a duplicate."""
    target, tokenizer = model
    earlier = tmp_path / "self.npz"
    self_prompts.save_prompts(whole, earlier, tokenizer.vocab_size)
    avoid = self_prompts.avoided_turns([earlier])
    assert avoid == {self_prompts.normalise(r["messages"][-1]["content"]) for r in whole}
    end = tokenizer.token_to_id("<|im_end|>")
    texts = [r["messages"][-1]["content"] for r in whole]
    again = iter([tokenizer.encode(t) + [end] for t in texts] * 4)

    def fake_batch(target, prompts, *args):  # every "sampled" turn one the earlier set had
        return [np.array(next(again)) for _ in prompts]

    monkeypatch.setattr(generate, "_generate_batch", fake_batch)
    monkeypatch.setattr(prompt_seeds, "SHARES", {"open": 1.0})
    flt = self_prompts.Filter(tokenizer, end, 200, self_prompts.heldout_turns(), seen=set(avoid))
    logged = []
    options = {"temperature": 1.0, "top_p": 0.95, "seed": 0, "log": logged.append}
    assert (
        self_prompts.sample_chunk(None, tokenizer, flt, 0, chunk=2, batch_size=2, **options) == []
    )
    assert "{'duplicate': 2}" in logged[0]
    with pytest.raises(ValueError, match="other settings"):  # another avoid set, same folder
        self_prompts.sample_prompts(target, tokenizer, 0, tmp_path / "s", **SMALL)
        self_prompts.sample_prompts(target, tokenizer, 0, tmp_path / "s", avoid=avoid, **SMALL)
