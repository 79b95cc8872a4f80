"""Refusals at load: a config switch, rope type or GGUF layout a family does not implement
fails with a ModelLoadError naming it; a file with tensors no build step read fails naming
them (ignoring them gives plausible wrong text); the tensors a reference implementation
ignores too (a tied lm_head copy, old rotary inv_freq buffers) still load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.errors import ModelLoadError, UnsupportedArchitecture
from engine.loader import load_model
from tests.engine.families_util import assert_matches, token_ids
from tests.tiny_families import make_family_gguf, make_family_hf
from tests.tiny_models import make_llama_gguf, write_hf_dir

HF_REFUSALS = [
    ("llama", {"attention_bias": True}, "attention_bias=True"),
    ("llama", {"mlp_bias": True}, "mlp_bias=True"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("llama", {"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "'longrope'"),
    ("llama", {"rope_scaling": {"type": "su", "factor": 2.0}}, "'su'"),
    (
        "llama",
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "short_factor": [1.0]}},
        "short_factor",
    ),
    ("llama", {"rope_scaling": {"rope_type": "linear"}}, "needs a factor"),
    ("qwen3", {"attention_bias": True}, "attention_bias=True"),
    ("qwen2", {"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
    ("qwen2", {"hidden_act": "relu"}, "hidden_act='relu'"),
    ("gemma3", {"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
    ("gemma3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0"),
    ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
    ("gemma3", {"hidden_activation": "gelu"}, "hidden_activation='gelu'"),
]


@pytest.mark.parametrize(
    ("family", "overrides", "named"), HF_REFUSALS, ids=[r[2] for r in HF_REFUSALS]
)
def test_hf_switch_refused_by_name(tmp_path, family: str, overrides: dict, named: str) -> None:
    make_family_hf(tmp_path / "m", family, **overrides)
    with pytest.raises(ModelLoadError, match="not supported|needs a factor") as info:
        load_model(tmp_path / "m", EngineConfig(backend="numpy"))
    assert named in str(info.value) and "config.json" in str(info.value)


def test_gemma3_sliding_layers_rope_scaling_refused(tmp_path) -> None:
    make_family_hf(tmp_path / "g", "gemma3", tie=True)
    cfg_file = tmp_path / "g" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["rope_parameters"] = {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
    }
    cfg_file.write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="sliding layers' rope_type 'linear'"):
        load_model(tmp_path / "g", EngineConfig(backend="numpy"))


def _rewrite_gguf_key(path: Path, out: Path, key: str, value: str) -> None:
    """A copy of a GGUF with one more string key (the writer cannot append to a file)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture")):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    writer.add_string(key, value)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("llama.rope.scaling.type", "longrope", "rope.scaling.type 'longrope'"),
        ("general.architecture", "qwen35moe", "'qwen35moe'"),
        ("general.architecture", "qwen3next", "Gated DeltaNet"),
    ],
)
def test_gguf_refusals_name_what_is_missing(tmp_path, key: str, value: str, named: str) -> None:
    make_llama_gguf(tmp_path / "plain.gguf")
    if key == "general.architecture":
        make_llama_gguf(tmp_path / "bad.gguf", arch=value)
    else:
        _rewrite_gguf_key(tmp_path / "plain.gguf", tmp_path / "bad.gguf", key, value)
    with pytest.raises(ModelLoadError) as info:
        load_model(tmp_path / "bad.gguf", EngineConfig(backend="numpy"))
    assert named in str(info.value)
    if key == "general.architecture":
        assert isinstance(info.value, UnsupportedArchitecture)
        assert "Hugging Face" in str(info.value)  # what to load instead


def test_gguf_tensor_nothing_reads_fails_naming_it(tmp_path) -> None:
    """Attention biases in a llama GGUF (a Qwen2 file relabelled, say) are not read."""
    bias = {"blk.0.attn_q.bias": np.ones(64, np.float32), "blk.1.mystery.weight": np.ones(3)}
    make_family_gguf(tmp_path / "m.gguf", "llama", extra=bias)
    with pytest.raises(ModelLoadError, match="2 tensor") as info:
        load_model(tmp_path / "m.gguf", EngineConfig(backend="numpy"))
    assert "blk.0.attn_q.bias" in str(info.value) and "blk.1.mystery.weight" in str(info.value)


def test_hf_tensor_nothing_reads_fails_naming_it(tmp_path) -> None:
    spec = make_family_hf(tmp_path / "m", "llama")
    weights = dict(spec.weights) | {"model.layers.1.mlp.up_proj.bias": np.ones(128, np.float32)}
    write_hf_dir(tmp_path / "biased", "llama", dict(spec.config), weights)
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.up_proj\.bias"):
        load_model(tmp_path / "biased", EngineConfig(backend="numpy"))


def test_tensors_the_reference_ignores_still_load(tmp_path) -> None:
    """A tied model that also stores lm_head, and old per-layer rotary inv_freq buffers."""
    spec = make_family_hf(tmp_path / "m", "llama", tie=True)
    weights = dict(spec.weights)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].copy()
    weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)
    write_hf_dir(tmp_path / "extra", "llama", dict(spec.config), weights)
    assert_matches(tmp_path / "extra", spec, "numpy", token_ids())


def test_default_model_consumes_every_tensor() -> None:
    path = Path("~/.cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf").expanduser()
    if not path.is_file():
        pytest.skip("the default model is not downloaded")
    model = load_model(path, EngineConfig(backend="numpy"))
    assert model.config.family == "llama" and model.config.rope_scaling is None
