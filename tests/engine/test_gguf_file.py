"""engine.gguf_file: the GGUF reader behind read_gguf. The default model reads exactly as
mx.load read it (same metadata types and values, same quantized triples), the real Gemma
3 270M Q4_K_M file converts every tensor exactly, and broken or unsupported files are
refused with a message that names the file and the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx
import numpy as np
import pytest

from engine.errors import ModelLoadError
from engine.gguf_file import read_gguf_file
from engine.model_probe import probe_model
from kernels import quantized
from kernels.quantized import QuantizedWeight
from tests.tiny_models import make_llama_gguf


def refusal(path: Path) -> str:
    with pytest.raises(ModelLoadError) as err:
        read_gguf_file(path)
    assert path.name in str(err.value)
    return str(err.value)


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, mx.array):
        return (
            isinstance(b, mx.array)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(mx.array_equal(a, b).item())
        )
    return type(a) is type(b) and a == b


def test_tiny_file_reads_its_metadata_and_tensors(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    spec = make_llama_gguf(path, qtype="Q4_1", embed_qtype="Q8_0")
    meta, tensors = read_gguf_file(path)
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"].dtype == mx.uint32 and meta["llama.block_count"].item() == 2
    assert isinstance(meta["tokenizer.ggml.tokens"], list)
    q = tensors["blk.0.ffn_up.weight"]
    assert isinstance(q, QuantizedWeight) and (q.source, q.bits, q.group_size) == ("Q4_1", 4, 32)
    want = spec.weights["model.layers.0.mlp.up_proj.weight"]
    assert np.array_equal(quantized.dequantize(q), want)
    norm = tensors["blk.0.attn_norm.weight"]
    assert isinstance(norm, mx.array) and norm.dtype == mx.float32 and norm.shape == (64,)


def test_bf16_and_f16_tensors_stay_dense_as_stored(tmp_path: Path) -> None:
    path = tmp_path / "dense.gguf"
    w = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    bf16 = gguf.quants.quantize(w, gguf.GGMLQuantizationType.BF16)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("a.weight", bf16, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.add_tensor("b.weight", w.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _, tensors = read_gguf_file(path)
    a, b = tensors["a.weight"], tensors["b.weight"]
    assert a.dtype == mx.bfloat16 and a.shape == (3, 32) and b.dtype == mx.float16
    want = gguf.quants.dequantize(bf16, gguf.GGMLQuantizationType.BF16).reshape(3, 32)
    assert np.array_equal(np.array(a.astype(mx.float32)), want)
    assert np.array_equal(np.array(b), w.astype(np.float16))


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    make_llama_gguf(path, qtype="Q4_0")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    assert "truncated" in refusal(path)


def test_file_cut_inside_its_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "header.gguf"
    make_llama_gguf(path)
    path.write_bytes(path.read_bytes()[:200])
    assert "truncated or corrupt GGUF header" in refusal(path)


def test_bad_magic_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "magic.gguf"
    path.write_bytes(b"GGML" + bytes(100))
    assert "bad magic" in refusal(path)


def write_with_raw_tensor(path: Path, kind: gguf.GGMLQuantizationType) -> None:
    block_elements, block_bytes = gguf.GGML_QUANT_SIZES[kind]
    writer = gguf.GGUFWriter(str(path), "llama")
    raw = np.zeros((4, 256 // block_elements * block_bytes), dtype=np.uint8)
    writer.add_tensor("blk.0.ffn_down.weight", raw, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("kind", ["IQ4_XS", "IQ2_XXS", "TQ2_0"])
def test_unsupported_tensor_type_is_refused_by_name(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.gguf"
    write_with_raw_tensor(path, gguf.GGMLQuantizationType[kind])
    message = refusal(path)
    assert f"tensor blk.0.ffn_down.weight is {kind}, which is not supported" in message
    assert "Q4_K" in message and "Q6_K" in message  # what is supported
    with pytest.raises(ModelLoadError, match=f"is {kind}, which is not supported"):
        probe_model(path)


def test_unknown_tensor_type_id_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "unknown.gguf"
    write_with_raw_tensor(path, gguf.GGMLQuantizationType.Q6_K)
    data = bytearray(path.read_bytes())
    name = b"blk.0.ffn_down.weight"
    at = data.index(name) + len(name) + 4 + 2 * 8  # past n_dims and both dims: the type
    data[at : at + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert "tensor blk.0.ffn_down.weight has an unknown type (id 99)" in refusal(path)
    with pytest.raises(ModelLoadError, match="unknown type"):
        probe_model(path)


def test_probe_accepts_k_quants_and_checks_their_bytes(tmp_path: Path) -> None:
    path = tmp_path / "q6k.gguf"
    write_with_raw_tensor(path, gguf.GGMLQuantizationType.Q6_K)
    probe_model(path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match="truncated"):
        probe_model(path)


# -- real files -------------------------------------------------------------------------


@pytest.mark.real_model
def test_default_model_reads_as_mx_load_did() -> None:
    """The default model's Q4_1 / Q8_0 tensors become exactly the (weight, scales, biases)
    triples mx.load gave, and its metadata the same values of the same types."""
    from engine.default_model import default_model_path, is_default_model_present

    if not is_default_model_present():
        pytest.skip("the default model is not downloaded (make model)")
    path = default_model_path()
    meta, tensors = read_gguf_file(path)
    loaded: Any = mx.load(str(path), return_metadata=True)
    raw, want_meta = loaded
    assert meta.keys() == want_meta.keys()
    for key, value in want_meta.items():
        assert same_value(meta[key], value), key
    assert {n for n in raw if not n.endswith((".scales", ".biases"))} == tensors.keys()
    for name, t in tensors.items():
        if isinstance(t, QuantizedWeight):
            base = name.removesuffix(".weight")
            assert same_value(t.packed, raw[name]), name
            assert same_value(t.scales, raw[f"{base}.scales"]), name
            assert same_value(t.biases, raw[f"{base}.biases"]), name
        else:
            assert same_value(t, raw[name]), name


def gemma_path() -> Path:
    from engine.model_catalog import catalog_entry

    entry = catalog_entry("gemma3-270m")
    if entry is None or not entry.is_present():
        pytest.skip("Gemma 3 270M is not in the models folder")
    return entry.path()


@pytest.mark.real_model
def test_gemma3_q4_k_m_converts_every_tensor_exactly() -> None:
    """Q4_K, Q5_0, Q6_K, Q8_0 and F32 tensors of a real download: each dequantizes to
    gguf-py's float32 bit for bit (the sign of zero aside, as in test_gguf_quants)."""
    path = gemma_path()
    _, tensors = read_gguf_file(path)
    reader = gguf.GGUFReader(str(path))
    kinds = set()
    for t in reader.tensors:
        ours = tensors[t.name]
        kinds.add(t.tensor_type.name)
        if t.tensor_type.name == "F32":
            assert np.array_equal(np.array(ours), np.asarray(t.data)), t.name
            continue
        assert isinstance(ours, QuantizedWeight) and ours.source == t.tensor_type.name
        data, rows = np.asarray(t.data), ours.shape[0]
        for r0 in range(0, rows, 8192):  # a block of rows at a time: bounded memory
            r1 = min(rows, r0 + 8192)
            part = QuantizedWeight(
                ours.packed[r0:r1],
                ours.scales[r0:r1],
                ours.biases[r0:r1],
                ours.group_size,
                ours.bits,
            )
            want = gguf.quants.dequantize(data[r0:r1], t.tensor_type) + np.float32(0)
            got = quantized.dequantize(part) + np.float32(0)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), t.name
    assert kinds == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}
