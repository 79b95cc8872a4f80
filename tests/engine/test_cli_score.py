"""`python -m engine score` and `perplexity` run as a person runs them, on a tiny model:
the logits file equals the reference forward, and the printed figures follow from it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine import __main__ as entry
from engine.scoring import log_softmax
from tests.tiny_models import VOCAB_SIZE, reference_forward

TEXT = "the sea and the sky are blue; why is the sea blue? " * 12


def test_score_writes_every_positions_logits(tiny_llama_gguf, tmp_path: Path, capsys) -> None:
    model, spec = tiny_llama_gguf
    ids = np.random.default_rng(1).integers(0, VOCAB_SIZE, size=300)  # more than one chunk
    np.save(tmp_path / "ids.npy", ids)
    argv = ["score", "--model", str(model), "--ids-file", str(tmp_path / "ids.npy")]
    argv += ["--kv-dtype", "float32"]  # the float32 bound against the reference
    assert (
        entry.main([*argv, "--out", str(tmp_path / "logits.npy"), "--backend", "numpy", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out) == {
        "out": str(tmp_path / "logits.npy"),
        "positions": 300,
        "vocab": VOCAB_SIZE,
    }
    logits = np.load(tmp_path / "logits.npy")
    assert logits.dtype == np.float32 and logits.shape == (300, VOCAB_SIZE)
    assert np.abs(logits - reference_forward(spec, ids.tolist())).max() <= 1e-4
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (np.array([[1, 2], [3, 4]]), "one\\s+non-empty row of integer token ids"),
        (np.array([0.5, 1.5]), "one\\s+non-empty row of integer token ids"),
        (np.array([1, VOCAB_SIZE]), f"token id {VOCAB_SIZE} is outside the model's vocabulary"),
        (np.arange(600) % 7, "600 token ids, but the model holds 512 positions"),
    ],
)
def test_score_refuses_ids_it_cannot_score(
    tiny_llama_gguf, tmp_path: Path, capsys, ids: np.ndarray, message: str
) -> None:
    np.save(tmp_path / "ids.npy", ids)
    argv = ["score", "--model", str(tiny_llama_gguf[0]), "--ids-file", str(tmp_path / "ids.npy")]
    assert entry.main([*argv, "--out", str(tmp_path / "out.npy"), "--backend", "numpy"]) == 2
    assert __import__("re").search(message, capsys.readouterr().err)
    assert not (tmp_path / "out.npy").exists()


def _perplexity(model: Path, tmp_path: Path, capsys, *flags: str) -> dict:
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    argv = ["perplexity", "--model", str(model), "--file", str(tmp_path / "text.txt")]
    assert entry.main([*argv, "--ctx", "64", "--backend", "numpy", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_perplexity_scores_the_second_half_of_each_chunk(tiny_llama_gguf, tmp_path, capsys) -> None:
    from engine.loader import load_model

    model, spec = tiny_llama_gguf
    figures = _perplexity(model, tmp_path, capsys)
    tokenizer = load_model(model).tokenizer
    ids = tokenizer.encode(TEXT, add_special=True)
    num_chunks = len(ids) // 64
    assert figures["num_chunks"] == num_chunks >= 2
    assert figures["num_scored"] == num_chunks * 31  # positions 32..62 predict 33..63
    nlls = []
    for c in range(num_chunks):  # the definition, written out on the reference forward
        chunk = ids[c * 64 : (c + 1) * 64]  # the tiny tokenizer adds no BOS
        logprobs = log_softmax(reference_forward(spec, chunk))
        nlls += [-logprobs[j, chunk[j + 1]] for j in range(32, 63)]
    assert figures["perplexity"] == pytest.approx(float(np.exp(np.mean(nlls))), rel=1e-4)
    assert figures["mean_kl"] is None


def test_kl_against_the_same_models_logits_is_zero(tiny_llama_gguf, tmp_path, capsys) -> None:
    model = tiny_llama_gguf[0]
    base = tmp_path / "base.npz"
    first = _perplexity(model, tmp_path, capsys, "--save-logits", str(base))
    again = _perplexity(model, tmp_path, capsys, "--kl-base", str(base))
    assert again["perplexity"] == pytest.approx(first["perplexity"], rel=1e-9)
    assert abs(again["mean_kl"]) < 1e-6
    assert again["top1_agreement"] == 1.0


def test_kl_against_another_quantization(tiny_models, tmp_path, capsys) -> None:
    f32, q4 = (
        tiny_models.gguf(qtype="F32")[0],
        tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")[0],
    )
    base = tmp_path / "base.npz"
    _perplexity(f32, tmp_path, capsys, "--save-logits", str(base))
    figures = _perplexity(q4, tmp_path, capsys, "--kl-base", str(base))
    assert 0.0 < figures["mean_kl"] < 1.0  # a quantization moves the distributions a little
    assert 0.5 < figures["top1_agreement"] <= 1.0


def test_perplexity_refuses_a_text_shorter_than_one_chunk(
    tiny_llama_gguf, tmp_path, capsys
) -> None:
    (tmp_path / "short.txt").write_text("too short", encoding="utf-8")
    argv = ["perplexity", "--model", str(tiny_llama_gguf[0]), "--file", str(tmp_path / "short.txt")]
    assert entry.main([*argv, "--ctx", "64", "--backend", "numpy"]) == 2
    assert "perplexity with --ctx 64 needs at least 64" in capsys.readouterr().err


def test_kl_base_of_another_text_is_refused(tiny_llama_gguf, tmp_path, capsys) -> None:
    model = tiny_llama_gguf[0]
    base = tmp_path / "base.npz"
    _perplexity(model, tmp_path, capsys, "--save-logits", str(base))
    (tmp_path / "other.txt").write_text(TEXT.upper(), encoding="utf-8")
    argv = ["perplexity", "--model", str(model), "--file", str(tmp_path / "other.txt")]
    assert entry.main([*argv, "--ctx", "64", "--backend", "numpy", "--kl-base", str(base)]) == 2
    assert "the base logits were saved for other tokens" in capsys.readouterr().err
