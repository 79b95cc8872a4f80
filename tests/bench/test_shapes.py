"""`python -m bench shapes`: the files it writes are what llama.cpp would have written for the
shape (against llama-quantize's own Q4_K_M output of tiny checkpoints in tests/oracles), the
true shapes have their published sizes, and both our engine and llama.cpp run the tiny ones
to the same logits."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from bench import shapes
from bench.shapes import SHAPES, GatedDeltaNet, Llama3Rope, Shape, Vocabulary
from bench.shapes_gguf import (
    BLOCKS,
    parameter_count,
    random_blocks,
    rope_freqs,
    tensor_plan,
    vocabulary,
    write_gguf,
)
from engine.loader import load_model
from tests.tolerances import assert_logits_close, engine_config

ORACLES = Path(__file__).parents[1] / "oracles" / "fixtures"
TINY = ("tiny-llama", "tiny-qwen3", "tiny-qwen3.5")
TRUE = ("llama-3.2-1b", "llama-3.1-8b", "qwen3-4b", "qwen3.5-0.8b")
PROMPT = "the model reads every token of the conversation once and keeps its keys and values"
# llama.cpp quantizes activations to 8 bits (ours multiply in float32 here): its logits sit a
# few % from ours (median over positions; our own int8 path is as far), most greedy tokens
# agree. Gated DeltaNet layers of random weights renormalize sums that nearly cancel, so 8-bit
# noise grows there (ours int8 vs float: up to 40% at a position). A wrong layout (value
# heads in HF's order) is >100% off with 1 greedy token in 10 agreeing.
LLAMA_CPP_CLOSE = {"llama": (0.05, 0.85), "qwen3": (0.05, 0.85), "qwen35": (0.15, 0.75)}
ORACLE_ARCHS = dict(llama="llama", llama_rope_llama3="llama", qwen3="qwen3", qwen3_5="qwen35")


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("shapes")
    return {name: write_gguf(SHAPES[name], out / f"{name}.gguf") for name in TINY}


def tensors_of(path: Path) -> list[tuple[str, str, list[int]]]:
    """(name, type, numpy-order shape) of every tensor, in the file's order."""
    reader = gguf.GGUFReader(str(path))
    return [(t.name, t.tensor_type.name, [int(n) for n in t.shape[::-1]]) for t in reader.tensors]


def fixture_shape(case: str) -> Shape:
    """A tiny checkpoint of tests/oracles as a shape (its tiny tokenizer: 3 specials)."""
    c: dict[str, Any] = json.loads((ORACLES / case / "config.json").read_text())
    rope = c["rope_parameters"]
    specials = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    vocab = Vocabulary("smollm", 3, specials, "", specials[1], specials[2], None, False, "")
    linear = None
    if case == "qwen3_5":
        linear = GatedDeltaNet(
            num_key_heads=c["linear_num_key_heads"],
            num_value_heads=c["linear_num_value_heads"],
            key_head_dim=c["linear_key_head_dim"],
            value_head_dim=c["linear_value_head_dim"],
            conv_kernel=c["linear_conv_kernel_dim"],
            full_attention_interval=c["layer_types"].index("full_attention") + 1,
            partial_rotary_factor=rope["partial_rotary_factor"],
            rope_sections=(*rope["mrope_section"], 0),
        )
    scaling = None
    if rope.get("rope_type") == "llama3":
        scaling = Llama3Rope(
            rope["factor"],
            rope["low_freq_factor"],
            rope["high_freq_factor"],
            rope["original_max_position_embeddings"],
        )
    return Shape(
        case,
        ORACLE_ARCHS[case],
        case,
        f"tests/oracles/fixtures/{case}",
        hidden_size=c["hidden_size"],
        num_layers=c["num_hidden_layers"],
        num_heads=c["num_attention_heads"],
        num_kv_heads=c["num_key_value_heads"],
        head_dim=c["head_dim"],
        intermediate_size=c["intermediate_size"],
        vocab_size=c["vocab_size"],
        tie_embeddings=c["tie_word_embeddings"],
        rope_theta=rope["rope_theta"],
        rms_norm_eps=c["rms_norm_eps"],
        context_length=c["max_position_embeddings"],
        vocab=vocab,
        llama3_rope=scaling,
        linear=linear,
    )


# -- what llama.cpp writes -----------------------------------------------------------------


@pytest.mark.parametrize("case", ["llama", "qwen3", "qwen3_5"])
def test_plan_is_what_llama_quantize_wrote(case: str) -> None:
    """Names, order, types (Q6_K output, use_more_bits, the Q5_0 / Q8_0 fallbacks of rows of
    64) and shapes of llama-quantize's Q4_K_M file of the same checkpoint."""
    plan = [(t.name, t.kind, list(t.shape)) for t in tensor_plan(fixture_shape(case))]
    assert plan == tensors_of(ORACLES / case / "Q4_K_M.gguf")


@pytest.mark.parametrize("case", ["llama", "qwen3", "qwen3_5"])
def test_architecture_keys_are_the_converters(case: str, tmp_path: Path) -> None:
    shape = fixture_shape(case)
    ours = gguf.GGUFReader(str(write_gguf(shape, tmp_path / "x.gguf"))).fields
    theirs = gguf.GGUFReader(str(ORACLES / case / "Q4_K_M.gguf")).fields
    keys = {k for k in theirs if k.startswith(f"{shape.arch}.") or k.startswith("general.")}
    keys -= {"general.name", "general.size_label"}
    # the converter writes its default interval 4 where a config has only layer_types (here
    # 1 linear + 1 full); the recurrent_layers array beside it says which layer is which
    keys.discard("qwen35.full_attention_interval")
    assert keys <= set(ours)
    for key in keys:
        assert ours[key].contents() == theirs[key].contents(), key


def test_rope_freqs_are_the_converters() -> None:
    shape = fixture_shape("llama_rope_llama3")
    reader = gguf.GGUFReader(str(ORACLES / "llama_rope_llama3" / "F16.gguf"))
    want = next(np.array(t.data) for t in reader.tensors if t.name == "rope_freqs.weight")
    np.testing.assert_allclose(rope_freqs(shape), want, rtol=1e-6)


@pytest.mark.parametrize("name", TINY)
def test_written_file_holds_the_plan(name: str, tiny_files: dict[str, Path]) -> None:
    shape = SHAPES[name]
    plan = tensor_plan(shape)
    assert tensors_of(tiny_files[name]) == [(t.name, t.kind, list(t.shape)) for t in plan]
    fields = gguf.GGUFReader(str(tiny_files[name])).fields
    assert fields["general.architecture"].contents() == shape.arch
    assert fields[f"{shape.arch}.block_count"].contents() == shape.num_layers
    assert len(fields["tokenizer.ggml.tokens"].contents()) == shape.vocab_size
    assert fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q4_K_M


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_random_blocks_decode_to_the_asked_spread(kind: str) -> None:
    """The fixed sub-block fields and d decode (gguf-py's reference) to zero-mean weights of
    about the std asked (x 1.04: d carries a factor uniform in [0.5, 1.5])."""
    blocks = random_blocks(kind, (64, 1024), 0.02, np.random.PCG64(1))
    w = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind])
    assert np.isfinite(w).all()
    assert w.std() == pytest.approx(0.02 * np.sqrt(13 / 12), rel=0.05)
    assert abs(w.mean()) < 0.02 * 0.02


def test_q4_0_file_is_q4_0_but_the_output() -> None:
    plan = tensor_plan(SHAPES["llama-3.1-8b"], "q4_0")
    matrices = {t.name: t.kind for t in plan if len(t.shape) == 2}
    assert matrices.pop("output.weight") == "Q6_K"
    assert set(matrices.values()) == {"Q4_0"}
    tied = {t.name: t.kind for t in tensor_plan(SHAPES["llama-3.2-1b"], "q4_0", "Q8_0")}
    assert tied["token_embd.weight"] == "Q8_0"


# -- the true shapes -------------------------------------------------------------------------


@pytest.mark.parametrize("name", TRUE)
def test_true_shape_has_the_published_size(name: str) -> None:
    shape = SHAPES[name]
    assert shape.published_params is not None
    # Qwen3.5-0.8B's count includes its vision tower (~0.1B), which a text GGUF leaves out
    tolerance = 0.07 if shape.arch == "qwen35" else 0.01
    assert parameter_count(shape) == pytest.approx(shape.published_params, rel=tolerance)
    kinds = {t.kind for t in tensor_plan(shape)}
    assert kinds == {"F32", "Q4_K", "Q6_K"}  # every row fills its K-quant blocks


def test_q4_k_m_gives_more_bits_where_llama_cpp_does() -> None:
    """Llama 3.2 1B (16 layers): attn_v and ffn_down are Q6_K in layers 0, 1, 4, 7, 10, 13,
    14, 15; the tied embedding is Q6_K. Qwen3.5 counts attn_qkv and attn_v together."""
    plan = {t.name: t.kind for t in tensor_plan(SHAPES["llama-3.2-1b"])}
    for stem in ("attn_v", "ffn_down"):
        q6 = [i for i in range(16) if plan[f"blk.{i}.{stem}.weight"] == "Q6_K"]
        assert q6 == [0, 1, 4, 7, 10, 13, 14, 15]
    assert plan["token_embd.weight"] == "Q6_K" and "output.weight" not in plan
    hybrid = {t.name: t.kind for t in tensor_plan(SHAPES["qwen3.5-0.8b"])}
    mixers = [f"blk.{i}.{'attn_qkv' if i % 4 != 3 else 'attn_v'}.weight" for i in range(24)]
    q6 = [i for i, name in enumerate(mixers) if hybrid[name] == "Q6_K"]
    assert q6 == [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]


@pytest.mark.parametrize(
    ("name", "token", "token_id"),
    [
        ("llama-3.2-1b", "<|begin_of_text|>", 128000),
        ("llama-3.2-1b", "<|eot_id|>", 128009),
        ("llama-3.2-1b", "<|reserved_special_token_247|>", 128255),
        ("qwen3-4b", "<|im_end|>", 151645),
        ("qwen3-4b", "</think>", 151668),
        ("qwen3-4b", "[PAD151935]", 151935),
        ("qwen3.5-0.8b", "<|endoftext|>", 248044),
        ("qwen3.5-0.8b", "<|im_end|>", 248046),
    ],
)
def test_vocabulary_has_the_true_size_and_special_ids(name: str, token: str, token_id: int) -> None:
    tokens, types, merges = vocabulary(SHAPES[name])
    assert len(tokens) == len(set(tokens)) == len(types) == SHAPES[name].vocab_size
    assert tokens.index(token) == token_id
    assert merges and all(" " in m for m in merges)


# -- our engine and llama.cpp on the tiny shapes ---------------------------------------------


def our_logits(path: Path, backend: str = "numpy") -> tuple[np.ndarray, list[int]]:
    lm = load_model(path, engine_config(backend))
    ids = lm.tokenizer.encode(PROMPT)
    logits = lm.runner.forward(ids, lm.runner.new_state(), logits="all")
    return np.asarray(logits, dtype=np.float64), ids


@pytest.mark.parametrize("name", TINY)
def test_engine_runs_tiny_shape_to_sane_logits(name: str, tiny_files: dict[str, Path]) -> None:
    logits, ids = our_logits(tiny_files[name])
    assert len(ids) > 30 and max(ids) < 256 + 702  # bytes and letter pairs, no fillers
    assert np.isfinite(logits).all()
    spread = logits.std(axis=-1)
    assert np.all((spread > 1.0) & (spread < 10.0))  # LOGIT_STD ~3: not flat, not exploding
    assert logits.std(axis=0).mean() > 0.3 * spread.mean()  # positions differ
    assert len(set(logits.argmax(axis=-1).tolist())) > len(ids) // 4


@pytest.mark.parametrize("name", TINY)
def test_mlx_backend_reads_tiny_shape_alike(name: str, tiny_files: dict[str, Path]) -> None:
    """MLX (float32, on this machine's CPU) holds the Q6_K tensors dense, NumPy packed."""
    numpy_logits, _ = our_logits(tiny_files[name], "numpy-float32")
    mlx_logits, _ = our_logits(tiny_files[name], "mlx-float32")
    assert_logits_close(mlx_logits, numpy_logits, "float32", SHAPES[name].hidden_size)


@pytest.mark.parametrize("name", TINY)
def test_llama_cpp_agrees_on_tiny_shape(name: str, tiny_files: dict[str, Path]) -> None:
    """llama.cpp (llama-cpp-python) loads the file, tokenizes the prompt as we do, and its
    logits are ours within its 8-bit activations' distance (LLAMA_CPP_CLOSE)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    ours, ids = our_logits(tiny_files[name])
    llm = llama_cpp.Llama(
        model_path=str(tiny_files[name]), n_ctx=256, n_threads=2, logits_all=True, verbose=False
    )
    assert llm.tokenize(PROMPT.encode(), add_bos=False, special=False) == ids
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)], dtype=np.float64)
    relative = np.linalg.norm(ours - theirs, axis=-1) / np.linalg.norm(theirs, axis=-1)
    median_bound, agreement = LLAMA_CPP_CLOSE[SHAPES[name].arch]
    assert np.median(relative) < median_bound, relative.round(3)
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= agreement


def test_cli_lists_and_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert shapes.main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in SHAPES)
    argv = ["write", "--shape", "tiny-qwen3", "--out", str(tmp_path), "--quant", "q4_0"]
    assert shapes.main(argv) == 0
    path = tmp_path / "tiny-qwen3-q4_0.gguf"
    assert str(path) in capsys.readouterr().out
    kinds = {kind for _, kind, _ in tensors_of(path)}
    assert kinds == {"F32", "Q4_0", "Q6_K"}  # Q6_K: the tied embedding
    assert not list(tmp_path.glob(".*partial"))


def test_shape_refuses_a_hybrid_without_linear_layers() -> None:
    with pytest.raises(ValueError, match="Gated DeltaNet"):
        replace(SHAPES["qwen3.5-0.8b"], linear=None)


def test_llama_cpp_comparison_tells_a_wrong_head_order(
    tiny_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards LLAMA_CPP_CLOSE: reading tiny-qwen3.5's value heads in HF's grouped order
    instead of ggml's tiled one puts the logits far outside it."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from engine.models import qwen3_5

    init = qwen3_5.GatedDeltaNet.__init__

    def grouped(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.tiled = False

    monkeypatch.setattr(qwen3_5.GatedDeltaNet, "__init__", grouped)
    ours, ids = our_logits(tiny_files["tiny-qwen3.5"])
    path = str(tiny_files["tiny-qwen3.5"])
    llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)], dtype=np.float64)
    relative = np.linalg.norm(ours - theirs, axis=-1) / np.linalg.norm(theirs, axis=-1)
    assert np.median(relative) > 4 * LLAMA_CPP_CLOSE["qwen35"][0]
