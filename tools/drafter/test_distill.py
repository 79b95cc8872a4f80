"""Distillation and best-checkpoint selection (torch: /tmp/tvenv/bin/python -m pytest -q
tools/drafter): the loss is the KL from the target's distribution, its gradient moves the
drafter toward it, the target's distribution for row j comes from position a + j - 1,
and best.pt holds the best eval_chat's weights."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tools.drafter import data, losses, settings, train
from tools.drafter.safetensors_io import read_drafter_file
from tools.drafter.test_model import CFG, tiny_drafter

MODEL = Path.home() / ".cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf"
needs_model = pytest.mark.skipif(not MODEL.exists(), reason="the default model is not fetched")


def _softmax(xs: list[float]) -> list[float]:
    e = [math.exp(x) for x in xs]
    return [v / sum(e) for v in e]


def test_distill_loss_is_the_weighted_kl():
    target_logits = [[2.0, 0.0, -1.0], [0.5, 0.5, 3.0], [1.0, 2.0, 3.0]]
    drafter_logits = [[0.0, 1.0, 0.0], [1.0, -2.0, 0.5], [9.0, 9.0, 9.0]]
    weights = [1.0, 0.5, 0.25]
    kls = []
    for t, d in zip(target_logits, drafter_logits, strict=True):
        p, q = _softmax(t), _softmax(d)
        kls.append(sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True)))
    want = (1.0 * kls[0] + 0.5 * kls[1]) / 1.5  # row 3 ignored (its label is -100)
    logp = losses.target_log_probs(torch.tensor([target_logits]))
    got = losses.distill_loss(
        torch.tensor([drafter_logits]), logp, torch.tensor([[0, 2, -100]]), torch.tensor(weights)
    )
    assert got.item() == pytest.approx(want, rel=1e-6)
    assert kls[2] > 0.1  # the ignored row would have moved the figure
    # the mix: distill * KL + (1 - distill) * CE against the hard labels
    hard = losses.block_loss(torch.tensor([drafter_logits]), torch.tensor([[0, 2, -100]]),
                             torch.tensor(weights))  # fmt: skip
    mixed, _ = losses.mixed_loss(torch.tensor([drafter_logits]), torch.tensor([[0, 2, -100]]),
                                 torch.tensor(weights), logp, 0.25)  # fmt: skip
    assert mixed.item() == pytest.approx(0.25 * want + 0.75 * hard.item(), rel=1e-6)


def test_the_gradient_moves_the_drafter_toward_the_target():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 4, generator=gen, requires_grad=True)
    logp = losses.target_log_probs(torch.randn(2, 3, 4, generator=gen) * 3)
    targets = torch.tensor([[0, 1, -100], [2, 3, 1]])
    weights = torch.tensor([1.0, 0.6, 0.3])
    losses.distill_loss(logits, logp, targets, weights).backward()
    w = weights.expand(2, 3) * (targets != -100)
    want = w[..., None] * (torch.softmax(logits.detach(), -1) - logp.exp()) / w.sum()
    torch.testing.assert_close(logits.grad, want)
    # a drafter trained on the KL alone comes to propose the target's choices
    drafter = tiny_drafter().float()
    captures = torch.randn(2, 12, CFG.hidden, generator=gen)
    tokens = torch.randint(0, 70, (2, 12), generator=gen)
    anchors = torch.tensor([[3, 6], [2, 7]])
    want_logp = losses.target_log_probs(torch.randn(2, 2, CFG.block - 1, CFG.vocab_size,
                                                    generator=gen) * 4)  # fmt: skip
    rows = torch.zeros(2, 2, CFG.block - 1, dtype=torch.long)
    ws = losses.row_weights(CFG.block, 7.0)
    optimizer = torch.optim.Adam(drafter.parameters(), lr=3e-3)
    first = None
    for _ in range(60):
        out = drafter.train_forward(captures, tokens, anchors)
        loss = losses.distill_loss(out, want_logp, rows, ws)
        first = loss.item() if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out = drafter.train_forward(captures, tokens, anchors)
    assert losses.distill_loss(out, want_logp, rows, ws).item() < 0.5 * first
    agree = (out.argmax(-1) == want_logp.argmax(-1)).float().mean().item()
    assert agree > 0.8


@needs_model
def test_row_j_is_supervised_by_the_targets_distribution_at_a_plus_j_minus_1():
    """On the target's own greedy replies the target's argmax at the row's position is the
    row's true token; one position later it is not."""
    from tools.drafter.target import Target

    target = Target(MODEL, "cpu")
    seqs = data.Sequences.load(train.EVAL_CHAT)
    index = data.vocab_lookup(np.arange(49152), 49152)
    batch = data.make_batch(seqs, np.arange(3), index, 5, 6, 200, np.random.default_rng(0))
    captures = target.captures(batch.tokens)
    full = torch.arange(49152)
    logp = losses.row_target_logp(target, captures, batch.anchors, full, 5)
    valid = batch.targets != -100
    agree = (logp.argmax(-1) == batch.targets)[valid].float().mean().item()
    shifted = losses.row_target_logp(target, captures, batch.anchors + 1, full, 5)
    off = (shifted.argmax(-1) == batch.targets)[valid].float().mean().item()
    assert agree > 0.9 and off < 0.3, (agree, off)
    # and the logits are the forward's own
    logits = target.model(input_ids=batch.tokens[:1, :40]).logits[0]
    ids = torch.tensor([5, 77, 2, 1000])
    got = target.vocab_logits(captures[0, :40], ids)
    torch.testing.assert_close(got, logits[:, ids], rtol=1e-4, atol=1e-4)


def test_better_ranks_acceptance_then_row_one_and_keeps_ties_early():
    best = {"acceptance": 1.5, "acc": [0.3]}
    assert settings.better({"acceptance": 1.6, "acc": [0.1]}, best)
    assert settings.better({"acceptance": 1.5, "acc": [0.31]}, best)
    assert not settings.better({"acceptance": 1.5, "acc": [0.3]}, best)
    assert not settings.better({"acceptance": 1.4, "acc": [0.9]}, best)
    assert settings.better({"acceptance": 1.0, "acc": [0.0]}, None)


@needs_model
def test_best_checkpoint_holds_the_best_eval_chat_and_patience_stops(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 2000, size=n) for n in (30, 41, 25, 36)]
    data.Sequences.from_lists(seqs, [10, 12, 8, 20], [True] * 4, [0, 1, 2, 3]).save(
        tmp_path / "s.npz"
    )
    scripted = {1: 1.1, 2: 1.5, 3: 1.3, 4: 1.5, 5: 1.2, 6: 1.9}  # step 4 ties step 2

    def evaluations(self):
        score = {"acc": [0.2], "acceptance": scripted[self.step]}
        return {"eval": score, "eval_chat": score}

    monkeypatch.setattr(train.Trainer, "evaluations", evaluations)
    out = tmp_path / "run"
    args = ["train", "--model", str(MODEL), "--data", str(tmp_path / "s.npz"), "--out",
            str(out), "--device", "cpu", "--layers", "1", "--intermediate", "32", "--block",
            "4", "--vocab-size", "64", "--batch", "2", "--anchors", "2", "--steps", "6",
            "--warmup", "1", "--heldout-fraction", "0.25", "--eval-every", "1",
            "--patience", "2", "--resume"]  # fmt: skip
    train.main(args)
    last = torch.load(out / train.CHECKPOINT, weights_only=True)
    best = torch.load(out / train.BEST, weights_only=True)
    assert last["step"] == 4  # two evaluations (3, 4) without a new best
    assert best["step"] == 2 and best["eval"]["acceptance"] == 1.5
    assert last["best"]["step"] == 2
    differs = [not torch.equal(best["drafter"][k], last["drafter"][k]) for k in best["drafter"]]
    assert any(differs)  # the best is the step-2 weights, not the last ones
    train.main(args)  # a resumed early-stopped run stays stopped
    assert torch.load(out / train.CHECKPOINT, weights_only=True)["step"] == 4
    path = tmp_path / "best.safetensors"
    train.main(["export", "--model", str(MODEL), "--out", str(out), "--file", str(path),
                "--best"])  # fmt: skip
    tensors, meta = read_drafter_file(path)
    assert meta["steps"] == "2"
    want = best["drafter"]["layers.0.o_proj.weight"].half().numpy()
    np.testing.assert_array_equal(tensors["layers.0.o_proj.weight"], want)
