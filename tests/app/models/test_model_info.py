"""What the picker reads of a model without loading it, from files written in the formats
real downloads use; a damaged or missing file says so instead of failing the picker."""

from __future__ import annotations

import gguf
import pytest

from app.models.model_info import file_size, read_model_info


def test_a_gguf_file_gives_its_family_quantization_context_and_size(tiny_models):
    path, _ = tiny_models.gguf(qtype="Q4_1", embed_qtype="Q8_0")
    info = read_model_info(path)
    reader = gguf.GGUFReader(str(path))  # the reference reader, the slow way
    assert info.family == reader.fields["general.architecture"].contents() == "llama"
    assert info.context_length == reader.fields["llama.context_length"].contents() == 512
    assert info.quantization == "Q4_1" and info.num_bytes == path.stat().st_size
    assert info.problem == ""


def test_a_quantized_mlx_folder_gives_its_bits_and_its_shards_size(tiny_models):
    path, _ = tiny_models.hf("qwen3", bits=4)
    info = read_model_info(path)
    assert (info.family, info.quantization, info.context_length) == ("qwen3", "4-bit", 512)
    assert info.num_bytes == sum(p.stat().st_size for p in path.glob("*.safetensors"))


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"GGUF\x03\x00\x00\x00\x01", "unreadable: the header ends early (a truncated file?)"),
        (b"PK\x03\x04 a zip file", "unreadable: not a GGUF file"),
    ],
)
def test_a_damaged_file_names_its_problem(tmp_path, content, problem):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    assert read_model_info(path).summary() == problem


def test_a_folder_without_config_and_a_missing_file(tmp_path):
    assert read_model_info(tmp_path).problem == "no config.json: not a model folder"
    assert read_model_info(tmp_path / "gone.gguf").problem == "not found (moved or deleted?)"


def test_sizes_read_as_people_write_them():
    assert [file_size(n) for n in (512, 76_992, 98_362_432, 4_920_000_000)] == [
        "512 B", "77 kB", "98 MB", "4.9 GB",
    ]  # fmt: skip
