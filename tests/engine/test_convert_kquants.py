"""K-quant GGUFs converted to MLX directories: a tensor MLX holds exactly (Q4_K, Q5_K: groups of
32) stays packed and dequantizes to gguf-py's values, one in groups of 16 (Q2_K, Q3_K, Q6_K),
which MLX has no form for, is written dense with gguf-py's float32 values and marked "not
quantized" for mlx-lm; the directory gives the GGUF's logits under our loader, and mlx-lm (where
installed) loads it to the same. Last, the file `python -m bench shapes write --shape
tiny-llama` writes: a Q4_K_M mixture with Llama 3's rope_freqs table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_map

from bench.shapes import SHAPES
from bench.shapes_gguf import write_gguf
from engine.convert import convert_gguf
from engine.loader import load_model
from tests.tiny_models import VOCAB_SIZE, make_llama_gguf
from tests.tolerances import as_f64, assert_logits_close, engine_config

# rows of 256 (a K-quant super-block) everywhere: hidden, head_dim * heads, intermediate
KQUANT_SHAPE = {"hidden_size": 256, "intermediate_size": 256, "head_dim": 64}
GROUP_OF_16 = ("Q2_K", "Q3_K", "Q6_K")
CASES = [
    {"qtype": "Q4_K", "embed_qtype": "Q6_K"},  # a Q4_K_M file's usual mix
    {"qtype": "Q6_K"},  # Q/K rows un-permuted in the dense form too
    {"qtype": "Q5_K", "embed_qtype": "Q2_K"},
    {"qtype": "Q3_K", "embed_qtype": "Q4_K"},
]
IDS = [int(t) for t in np.random.default_rng(1).integers(0, VOCAB_SIZE, 24)]


def case_id(case: dict) -> str:
    return "-".join(case.values())


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any, Path]]:
    """case -> (GGUF, the weights gguf-py decodes it to, the converted directory)."""
    root = tmp_path_factory.mktemp("convert_kquants")
    out = {}
    for case in CASES:
        path = root / f"{case_id(case)}.gguf"
        spec = make_llama_gguf(path, tie=False, **case, **KQUANT_SHAPE)
        out[case_id(case)] = (path, spec, convert_gguf(path, root / case_id(case)))
    return out


def _qtype(case: dict, name: str) -> str:
    return case.get("embed_qtype", case["qtype"]) if "embed_tokens" in name else case["qtype"]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_matrix_holds_the_ggufs_exact_values(files: dict, case: dict):
    _, spec, out = files[case_id(case)]
    config = json.loads((out / "config.json").read_text())
    quant = config.get("quantization") or {}
    tensors = mx.load(str(out / "model.safetensors"))
    for name, want in spec.weights.items():
        if want.ndim != 2:
            continue
        module = name.removesuffix(".weight")
        if _qtype(case, name) in GROUP_OF_16:
            assert quant.get(module, False) is False, module  # mlx-lm: not quantized
            assert f"{module}.scales" not in tensors
            got = np.array(tensors[name].astype(mx.float32))
        else:
            held = quant.get(module, quant)
            assert held["group_size"] == 32, module
            got = np.array(
                mx.dequantize(
                    tensors[name],
                    tensors[f"{module}.scales"],
                    tensors[f"{module}.biases"],
                    group_size=32,
                    bits=held["bits"],
                ).astype(mx.float32)
            )
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_dense_matrices_are_marked_not_quantized_beside_packed_ones(files: dict):
    _, _, out = files[case_id(CASES[0])]
    quant = json.loads((out / "config.json").read_text())["quantization"]
    assert (quant["group_size"], quant["bits"]) == (32, 4)
    assert quant["model.embed_tokens"] is False
    assert json.loads((files["Q6_K"][2] / "config.json").read_text()).get("quantization") is None


@pytest.mark.parametrize("backend", ["numpy-float32", "mlx-float32"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_directory_has_the_ggufs_logits(files: dict, case: dict, backend: str):
    path, spec, out = files[case_id(case)]
    logits = [_ours(p, backend) for p in (path, out)]
    scale = np.abs(logits[0]).max()  # K = 256 float32 sums: the bound relative to the logits
    assert np.abs(logits[1] - logits[0]).max() <= 2e-5 * scale


def _ours(path: Path, backend: str) -> np.ndarray:
    lm = load_model(path, engine_config(backend))
    return as_f64(lm.runner.forward(IDS, lm.runner.new_state(), logits="all"))


def _widen(x: mx.array) -> mx.array:
    return x.astype(mx.float32) if x.dtype in (mx.float16, mx.bfloat16) else x


def _mlx_lm_logits(out: Path) -> np.ndarray:
    from mlx_lm.utils import load_model as mlx_lm_load_model

    model, _ = mlx_lm_load_model(out)
    # float32 scales and norms (float16 as stored): the same float32 arithmetic as ours
    model.update(tree_map(_widen, model.parameters()))
    return np.array(model(mx.array(IDS)[None])[0], dtype=np.float64)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_mlx_lm_loads_the_kquant_conversion(files: dict, case: dict):
    pytest.importorskip("mlx_lm")
    path, _, out = files[case_id(case)]
    ours = _ours(path, "numpy-float32")
    assert np.abs(_mlx_lm_logits(out) - ours).max() <= 2e-5 * np.abs(ours).max()


def test_the_bench_shapes_llama_3_q4_k_m_file(tmp_path: Path):
    """Rope scaling as a rope_freqs table and a Q4_K_M mixture (Q6_K output and some
    attn_v / ffn_down): the case that made mlx-lm refuse the directory."""
    gguf_path = write_gguf(SHAPES["tiny-llama"], tmp_path / "tiny-llama.gguf")
    out = convert_gguf(gguf_path, tmp_path / "mlx")
    config = json.loads((out / "config.json").read_text())
    assert config["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,  # bench.shapes' tiny-llama
    }
    assert config["quantization"]["lm_head"] is False
    assert "rope_freqs.weight" not in mx.load(str(out / "model.safetensors"))
    from_gguf = _ours(gguf_path, "numpy-float32")
    assert_logits_close(_ours(out, "numpy-float32"), from_gguf, "float32", 256, "directory:")
    pytest.importorskip("mlx_lm")
    assert_logits_close(_mlx_lm_logits(out), from_gguf, "float32", 256, "mlx-lm:")
