"""Context rows made of several target layers (`train --taps`): the target's captures are
those layers' outputs side by side, the drafter's two forms still agree on them, a run
trains and exports with them, and the file says which layers it taps (the engine refuses
such a file until it hands out those rows). Run with torch: /tmp/tvenv/bin/python -m
pytest -q tools/drafter."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from tools.drafter import data, train
from tools.drafter.export import load_drafter
from tools.drafter.model import BlockDrafter, init_weights
from tools.drafter.safetensors_io import read_drafter_file
from tools.drafter.settings import Settings
from tools.drafter.test_model import CFG, TARGET_VOCAB

MODEL = Path.home() / ".cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf"
needs_model = pytest.mark.skipif(not MODEL.exists(), reason="the default model is not fetched")


def test_settings_take_rising_layers_ending_at_the_last():
    assert Settings().target_layers(30) == ()
    assert Settings(taps="3,15,29").target_layers(30) == (3, 15, 29)
    for bad in ("15,3,29", "3,15", "3,3,29", "3,30"):
        with pytest.raises(ValueError, match="rising layer numbers ending at the last, 29"):
            Settings(taps=bad).target_layers(30)
    with pytest.raises(ValueError, match="layer numbers"):
        Settings(taps="3;29")


def test_both_forms_agree_on_wide_captures():
    cfg = replace(CFG, target_layers=(0, 2, 5))
    gen = torch.Generator().manual_seed(3)
    embedding = torch.randn(TARGET_VOCAB, cfg.hidden, generator=gen, dtype=torch.float64)
    drafter = BlockDrafter(cfg, embedding, torch.arange(cfg.vocab_size)).double()
    init_weights(drafter, 0, std=0.2)
    assert tuple(drafter.fc.weight.shape) == (cfg.hidden, 3 * cfg.hidden)
    captures = torch.randn(2, 19, 3 * cfg.hidden, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, TARGET_VOCAB, (2, 19), generator=gen)
    anchors = torch.tensor([[2, 11], [7, 18]])
    batched = drafter.train_forward(captures, tokens, anchors)
    for n in range(2):
        for i, a in enumerate(anchors[n].tolist()):
            single = drafter.draft_block(captures[n, :a], int(tokens[n, a]), cfg.block)
            torch.testing.assert_close(batched[n, i], single, rtol=1e-10, atol=1e-10)
    # every tapped layer's columns reach the drafts
    for layer in range(3):
        moved = captures.clone()
        moved[..., layer * cfg.hidden : (layer + 1) * cfg.hidden] += 1.0
        assert (drafter.train_forward(moved, tokens, anchors) - batched).abs().max() > 1e-6


@needs_model
def test_the_targets_captures_are_its_layers_outputs_side_by_side():
    from tools.drafter.target import Target

    target = Target(MODEL, "cpu")
    tokens = torch.tensor([[1, 504, 3250, 314, 260, 3575, 282, 4649, 47]])
    wide = target.captures(tokens, (4, 17, 29))
    assert wide.shape == (1, 9, 3 * 576)
    states = target.model.model(input_ids=tokens, output_hidden_states=True).hidden_states
    # hidden_states[i + 1] is layer i's output (the last entry is after the final norm)
    torch.testing.assert_close(wide[..., :576], states[5].float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wide[..., 576:1152], states[18].float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(target.final_rows(wide), target.captures(tokens), rtol=0, atol=0)


@needs_model
def test_a_run_with_taps_trains_exports_and_names_its_layers(tmp_path):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 2000, size=n) for n in (30, 41, 25, 36)]
    data.Sequences.from_lists(seqs, [10, 12, 8, 20], [True] * 4, [0, 1, 2, 3]).save(
        tmp_path / "s.npz"
    )
    small = ["--layers", "1", "--intermediate", "64", "--block", "6", "--vocab-size", "64",
             "--batch", "2", "--anchors", "3", "--steps", "2", "--warmup", "1",
             "--heldout-fraction", "0.25", "--eval-every", "2", "--log-every", "1"]  # fmt: skip
    train.main(["train", "--model", str(MODEL), "--data", str(tmp_path / "s.npz"), "--out",
                str(tmp_path / "run"), "--device", "cpu", "--taps", "9,19,29", *small])  # fmt: skip
    path = tmp_path / "drafter.safetensors"
    train.main(
        ["export", "--model", str(MODEL), "--out", str(tmp_path / "run"), "--file", str(path)]
    )
    tensors, meta = read_drafter_file(path)
    assert meta["target_layers"] == "9,19,29"
    assert tensors["fc.weight"].shape == (576, 3 * 576)
    from tools.drafter.target import Target

    back = load_drafter(path, Target(MODEL, "cpu").embedding)
    assert back.cfg.target_layers == (9, 19, 29)
