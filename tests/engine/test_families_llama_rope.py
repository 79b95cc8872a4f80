"""Llama rope scalings (HF rope_scaling / rope_parameters and GGUF rope.scaling.* /
rope_freqs) against the float64 reference, in both backends; each scaling changes the
logits (a test that could not tell scaled from plain rope would pass either way)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.loader import load_model
from kernels.ops import make_ops
from tests.engine.families_util import BACKENDS, assert_matches, forward_all, token_ids
from tests.tiny_families import LLAMA3_ROPE, make_family_gguf, make_family_hf

# original_max_position_embeddings 64 with a 40-token prompt and head_dim 16: every scaling
# moves some frequencies, and yarn's ramp falls inside the 8 frequency pairs
HF_SCALINGS = {
    "llama3": {"rope_scaling": LLAMA3_ROPE},
    "linear": {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "legacy-type-key": {"rope_scaling": {"type": "linear", "factor": 2.0}},
    "yarn": {
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    },
    "yarn-attention-factor": {
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "attention_factor": 1.3,
            "beta_fast": 16,
        }
    },
    "rope-parameters": {
        "rope_parameters": {"rope_type": "linear", "factor": 3.0, "rope_theta": 5000.0}
    },
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(HF_SCALINGS))
def test_hf_rope_scalings_match_reference(tmp_path, name: str, backend: str) -> None:
    spec = make_family_hf(tmp_path / name, "llama", **HF_SCALINGS[name])
    assert_matches(tmp_path / name, spec, backend, token_ids())


@pytest.mark.parametrize("name", ["llama3", "yarn", "linear"])
def test_scaling_changes_the_logits(tmp_path, name: str) -> None:
    make_family_hf(tmp_path / "plain", "llama")
    make_family_hf(tmp_path / name, "llama", **HF_SCALINGS[name])
    ids = token_ids()
    diff = np.abs(
        forward_all(tmp_path / "plain", "numpy", ids) - forward_all(tmp_path / name, "numpy", ids)
    )
    assert diff.max() > 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_equals_plain_within_max_positions_and_refuses_past(tmp_path, backend) -> None:
    scaling = {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    spec = make_family_hf(tmp_path / "dyn", "llama", max_position_embeddings=48, **scaling)
    assert_matches(tmp_path / "dyn", spec, backend, token_ids())
    model = load_model(tmp_path / "dyn", EngineConfig(backend=backend)).runner
    state = model.new_state()
    model.forward(token_ids(n=48), state)
    with pytest.raises(ValueError, match="rope_type 'dynamic' past 48 positions"):
        model.forward([5], state)
    assert state.offset == 48 and not state.is_poisoned  # refused, and undone
    # the fused decode kernels (a GPU's path for 1-16 rows) do not check positions: the
    # model must not take them, or it would decode past 48 with plain rope
    assert "dynamic rope" in model.model.unfused_features()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gguf_rope_freqs_is_llama3_scaling(tmp_path, backend: str) -> None:
    path = tmp_path / "llama3.gguf"
    spec = make_family_gguf(path, "llama", rope_scaling=LLAMA3_ROPE)
    assert_matches(path, spec, backend, token_ids())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    ],
    ids=["linear", "yarn"],
)
def test_gguf_rope_scaling_keys(tmp_path, scaling: dict, backend: str) -> None:
    path = tmp_path / "scaled.gguf"
    spec = make_family_gguf(path, "llama", rope_scaling=scaling)
    assert_matches(path, spec, backend, token_ids())


def test_scaled_rope_model_does_not_take_the_fused_path(tmp_path) -> None:
    make_family_hf(tmp_path / "m", "llama", **HF_SCALINGS["llama3"])
    model = load_model(tmp_path / "m", EngineConfig(backend="mlx")).model
    assert "scaled rope" in model.unfused_features()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims", [16, 8])  # the whole head, and a partial rotary
def test_ops_rope_with_explicit_frequencies(backend: str, traditional: bool, dims: int) -> None:
    """ops.rope's inv_freq and mscale against the rotation written out in float64."""
    ops = make_ops(backend, "float32")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)  # [H, L, Dh]
    inv_freq = rng.uniform(0.01, 1.0, dims // 2)
    offset, mscale = 7, 1.25
    got = ops.to_numpy(ops.rope(ops.asarray(x), offset, dims, 1e4, traditional, inv_freq, mscale))
    angles = (offset + np.arange(5))[:, None] * inv_freq[None, :]  # [L, dims/2]
    cos, sin = np.cos(angles) * mscale, np.sin(angles) * mscale
    rot = x[..., :dims].astype(np.float64)
    a, b = (rot[..., 0::2], rot[..., 1::2]) if traditional else np.split(rot, 2, axis=-1)
    ra, rb = a * cos - b * sin, a * sin + b * cos
    want = x.astype(np.float64).copy()
    if traditional:
        want[..., 0:dims:2], want[..., 1:dims:2] = ra, rb
    else:
        want[..., :dims] = np.concatenate([ra, rb], axis=-1)
    assert np.abs(got - want).max() <= 1e-5
