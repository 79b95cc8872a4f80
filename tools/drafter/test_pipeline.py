"""train and export end to end on the real default model, on the CPU: a run stopped and
resumed lands on the same weights, bit for bit, as one that never stopped, and the
exported file reads back with the spec's metadata. Needs the model (make model) and torch
(/tmp/tvenv/bin/python -m pytest -q tools/drafter)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from tools.drafter import data, train
from tools.drafter.export import load_drafter
from tools.drafter.gguf_target import GGUFFile, embedding_check
from tools.drafter.safetensors_io import read_drafter_file

MODEL = Path.home() / ".cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(not MODEL.exists(), reason="the default model is not fetched")
SMALL = ["--layers", "1", "--intermediate", "64", "--block", "6", "--vocab-size", "64",
         "--batch", "2", "--anchors", "3", "--steps", "4", "--warmup", "2", "--heldout-fraction",
         "0.25", "--eval-every", "2", "--log-every", "1"]  # fmt: skip


def _train(tmp: Path, seqs: Path, out: str, *extra: str) -> dict:
    train.main(["train", "--model", str(MODEL), "--data", str(seqs), "--out", str(tmp / out),
                "--device", "cpu", *SMALL, *extra])  # fmt: skip
    return torch.load(tmp / out / train.CHECKPOINT, weights_only=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("drafter")
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 2000, size=n) for n in (30, 41, 25, 36)]
    data.Sequences.from_lists(seqs, [10, 12, 8, 20], [True] * 4, [0, 1, 2, 3]).save(tmp / "s.npz")
    whole = _train(tmp, tmp / "s.npz", "whole")
    _train(tmp, tmp / "s.npz", "split", "--run-steps", "2")
    resumed = _train(tmp, tmp / "s.npz", "split", "--resume")
    return tmp, whole, resumed


def test_a_resumed_run_continues_exactly(runs):
    _, whole, resumed = runs
    assert whole["step"] == resumed["step"] == 4
    assert whole["trained_tokens"] == resumed["trained_tokens"]
    for name, tensor in whole["drafter"].items():
        assert torch.equal(tensor, resumed["drafter"][name]), name
    first = whole["optimizer"]["state"][0]["exp_avg"]
    assert torch.equal(first, resumed["optimizer"]["state"][0]["exp_avg"])


def test_export_writes_the_spec_file(runs):
    tmp, whole, _ = runs
    path = tmp / "drafter.safetensors"
    train.main(["export", "--model", str(MODEL), "--out", str(tmp / "whole"), "--file", str(path)])
    tensors, meta = read_drafter_file(path)
    embedding = GGUFFile(MODEL).tensor("token_embd.weight")
    assert meta["format"] == "branchchat-block-drafter" and meta["version"] == "1"
    assert meta["target_check"] == embedding_check(embedding)
    assert (meta["target_hidden"], meta["target_vocab"], meta["heads"]) == ("576", "49152", "9")
    assert (meta["kv_heads"], meta["head_dim"], meta["block"], meta["layers"]) == (
        "3",
        "64",
        "6",
        "1",
    )
    assert (meta["intermediate"], meta["steps"]) == ("64", "4")
    assert float(meta["rope_base"]) == 100000.0 and float(meta["rms_eps"]) == pytest.approx(1e-5)
    assert tensors["layers.0.q_proj.weight"].shape == (576, 576)
    assert tensors["layers.0.k_proj.weight"].shape == (192, 576)
    assert tensors["layers.0.down_proj.weight"].shape == (576, 64)
    assert tensors["fc.weight"].dtype == np.float16 and tensors["vocab"].dtype == np.int32
    np.testing.assert_array_equal(tensors["vocab"], whole["drafter"]["vocab"].numpy())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert Path(f"{path}.sha256").read_text().split() == [digest, path.name]
    # the safetensors package reads our writer's file as we do
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == meta
        for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
            np.testing.assert_array_equal(f.get_tensor(name), tensors[name])
    # and one checkpoint exports to the same bytes every time
    again = tmp / "again.safetensors"
    train.main(["export", "--model", str(MODEL), "--out", str(tmp / "whole"), "--file", str(again)])
    assert again.read_bytes() == path.read_bytes()
    # the file's (float16) weights are the checkpoint's, rounded once
    drafter = load_drafter(path, torch.from_numpy(embedding))
    want = whole["drafter"]["layers.0.o_proj.weight"].half().float()
    assert torch.equal(drafter.layers[0].o_proj.weight.detach(), want)


def test_a_warm_start_begins_at_the_files_weights_and_vocabulary(runs):
    tmp, whole, _ = runs
    path = tmp / "start.safetensors"
    train.main(["export", "--model", str(MODEL), "--out", str(tmp / "whole"), "--file", str(path)])
    tensors, _ = read_drafter_file(path)
    warm = _train(tmp, tmp / "s.npz", "warm", "--init", str(path), "--run-steps", "0")
    assert warm["step"] == 0 and warm["settings"]["init"] == str(path)
    start = load_drafter(path, torch.from_numpy(GGUFFile(MODEL).tensor("token_embd.weight")))
    for name, tensor in start.state_dict().items():
        assert torch.equal(warm["drafter"][name], tensor), name
    np.testing.assert_array_equal(warm["drafter"]["vocab"].numpy(), tensors["vocab"])
    with pytest.raises(SystemExit, match="shape"):
        _train(tmp, tmp / "s.npz", "wrong", "--init", str(path), "--intermediate", "32")


def test_merged_sequences_keep_every_reply_and_its_prompt(tmp_path):
    rng = np.random.default_rng(1)
    a = data.Sequences.from_lists(
        [rng.integers(0, 90, 9) for _ in range(2)], [3, 4], [True, False], [0, 1]
    )
    b = data.Sequences.from_lists([rng.integers(0, 90, 7)], [2], [True], [5])
    a.save(tmp_path / "a.npz")
    b.save(tmp_path / "b.npz")
    out = tmp_path / "ab.npz"
    train.main(
        ["merge", "--data", str(tmp_path / "a.npz"), str(tmp_path / "b.npz"), "--out", str(out)]
    )
    ab = data.Sequences.load(out)
    assert list(ab.prompt_index) == [0, 1, 5] and list(ab.sampled) == [True, False, True]
    for n, (part, m) in enumerate([(a, 0), (a, 1), (b, 0)]):
        np.testing.assert_array_equal(ab.sequence(n), part.sequence(m))
        assert ab.reply_start[n] == part.reply_start[m]
