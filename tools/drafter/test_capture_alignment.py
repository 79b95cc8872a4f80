"""Training's view of a block equals the engine's, on a real decode: the rows the engine
hands its block drafter in one greedy request (tools/drafter/engine_accuracy.py, run in
the project's venv, drafting 3 tokens a step so every reply row comes from a verify's kept
rows) are target.py's captures of the same tokens, position by position; and at the
anchors data.make_batch draws, model.train_forward's logits are the engine's block logits,
row j labelled with token a + j. The fixture test (test_fixture.py) checks the drafter's
forward on given rows; this one checks which rows, at which positions.

The engine runs with float32 matmuls and K/V (cpu_matmul "float", kv_dtype "float32") so
that its rows equal transformers' to float32 rounding: its default int8 activations and
float16 K/V move them by ~3% (median relative L2), the same rows with noise, not others.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from tools.drafter import data
from tools.drafter.export import load_drafter
from tools.drafter.target import Target

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = ROOT / ".venv/bin/python"
SHIPPED = ROOT / "engine/drafters/smollm2-135m-instruct-block.safetensors"
MODEL = Path.home() / ".cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf"
ROWS = 4  # block rows compared per anchor
pytestmark = pytest.mark.skipif(
    not (MODEL.exists() and VENV_PYTHON.exists() and SHIPPED.exists()),
    reason="needs the default model, the project's venv and the shipped drafter",
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> dict[str, np.ndarray | int]:
    """One held-out conversation decoded by the engine: tokens, rows, block logits."""
    out = tmp_path_factory.mktemp("capture") / "capture.npz"
    command = [str(VENV_PYTHON), "-m", "tools.drafter.engine_accuracy", "--limit", "1",
               "--max-tokens", "40", "--rows", str(ROWS), "--backend", "numpy",
               "--cpu-matmul", "float", "--kv-dtype", "float32", "--force-k", "3",
               "--out", str(out)]  # fmt: skip
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=600)
    with np.load(out) as f:
        return {
            "tokens": f["tokens_0"],
            "start": int(f["reply_start_0"]),
            "rows": f["rows_0"],
            "logits": f["logits_0"],
        }


@pytest.fixture(scope="module")
def target() -> Target:
    return Target(MODEL)


def test_the_engine_hands_the_drafter_training_captures(engine, target):
    tokens, rows = engine["tokens"], engine["rows"]
    # every position but the last token's (it is pending, or the EOS) has its row
    assert rows.shape == (len(tokens) - 1, target.config["hidden_size"])
    captures = target.captures(torch.from_numpy(tokens)[None])[0].numpy()[: len(rows)]
    norm = np.linalg.norm(captures, axis=1)
    rel = np.linalg.norm(captures - rows, axis=1) / norm
    assert rel.max() < 1e-4, f"position {rel.argmax()} differs by {rel.max():.2e}"
    # the check has the power to see a shift: one position off is another row entirely
    shifted = np.linalg.norm(captures[1:] - rows[:-1], axis=1) / norm[1:]
    assert np.median(shifted) > 0.3
    # and the rows are the residual stream, not the final norm's output
    normed = captures / np.sqrt((captures**2).mean(-1, keepdims=True) + 1e-5)
    assert np.median(np.linalg.norm(normed - rows, axis=1) / norm) > 0.3


def test_training_blocks_are_the_engine_blocks(engine, target):
    tokens, start, want = engine["tokens"], engine["start"], engine["logits"]
    drafter = load_drafter(SHIPPED, target.embedding).eval()
    vocab = drafter.vocab.numpy()
    index = data.vocab_lookup(vocab, target.config["vocab_size"])
    seqs = data.Sequences.from_lists([tokens], [start], [False], [0])
    rng = np.random.default_rng(0)
    batch = data.make_batch(seqs, np.array([0]), index, drafter.cfg.block, 12, 768, rng)
    with torch.no_grad():
        captures = target.captures(batch.tokens)
        got = drafter.train_forward(captures, batch.tokens, batch.anchors)[0, :, :ROWS].numpy()
    anchors = batch.anchors[0].tolist()
    assert len(set(anchors)) == 12 and min(anchors) >= start
    agree = []
    for k, a in enumerate(anchors):
        engine_block = want[a - start]  # the engine's pass after pending tokens[a]
        scale = float(np.abs(engine_block).max())
        # the drafter's own K/V are float16 in the engine (its rows rounded once)
        assert np.abs(got[k] - engine_block).max() <= 2e-3 * scale, f"anchor {a}"
        agree.append(got[k].argmax(-1) == engine_block.argmax(-1))
        for j in range(1, ROWS + 1):
            label = int(batch.targets[0, k, j - 1])
            assert label == (int(index[tokens[a + j]]) if a + j < len(tokens) else -100)
    assert np.mean(agree) >= 0.95
