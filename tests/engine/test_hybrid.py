"""The Qwen3.5 / Qwen3-Next hybrid family: every on-disk layout x backend reproduces the
independent float64 reference, pieces equal one pass, and a verify tape replays exactly.

Each HybridSpec holds exactly the float32 values its file decodes to, so bfloat16 and 4-bit
files are held to the same tolerance as float32 ones. MLX runs in float32 (that tolerance)
and in bfloat16, a GPU's default, held to a bound derived from its rounding
(tests/tolerances.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.errors import UnsupportedArchitecture
from engine.loader import load_model
from engine.models import qwen3_5
from engine.models.base import FULL, LINEAR
from tests.hybrid_models import HybridSpec, make_hybrid_dir, reference_forward
from tests.tiny_models import VOCAB_SIZE
from tests.tolerances import BACKENDS, as_f64, assert_logits_close, compute_dtype, engine_config

# Max abs diff on logits of magnitude ~6. The tiny configs use rms_norm_eps 1e-5 (the release
# uses 1e-6): the gated output norm divides by the rms of o, which at the first positions can
# be ~1e-4 (o_0 = beta (q.k) v), and with eps 1e-6 float32 rounding there was amplified to
# ~3e-4 in the float64 reference itself under 1e-7 relative weight perturbations.
TOLERANCE = 1e-4  # float32; tests/tolerances.py's FLOAT32_ATOL
NUM_TOKENS = 40
PIECES = (5, 30, 1, 1)  # the 30-row piece runs the chunked kernel, the others the recurrent one

CASES = [
    {"layout": "hf"},
    {"layout": "hf", "dtype": "bfloat16", "tie": True},
    {"layout": "next"},
    {"layout": "mlx", "tie": True},
    {"layout": "mlx4"},
    {"layout": "mlx4", "dtype": "bfloat16", "tie": True},
]

HybridModel = tuple[Path, HybridSpec]


def case_id(case: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in case.items())


@pytest.fixture(scope="session")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """make(**kwargs) -> (path, spec), each distinct checkpoint written once per session."""
    root = tmp_path_factory.mktemp("hybrid_models")
    built: dict[tuple, HybridModel] = {}

    def make(**kwargs: Any) -> HybridModel:
        key = tuple(sorted(kwargs.items()))
        if key not in built:
            path = root / f"hybrid-{len(built)}"
            built[key] = (path, make_hybrid_dir(path, **kwargs))
        return built[key]

    return make


def token_ids(seed: int = 0, n: int = NUM_TOKENS) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB_SIZE, n)]


def assert_close(got: np.ndarray, want: np.ndarray, model: Any, what: str = "") -> None:
    """Within TOLERANCE in float32, within the bound derived from a coarser dtype's rounding
    (relative RMS over the rows, reductions over the hidden size) otherwise."""
    reduction = model.config.hidden_size
    assert_logits_close(got, want, compute_dtype(model.ops), reduction, what)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_layout_matches_reference(hybrid: Any, case: dict, backend: str) -> None:
    path, spec = hybrid(**case)
    ids = token_ids()
    model = load_model(path, engine_config(backend)).runner
    logits = as_f64(model.forward(ids, model.new_state(), logits="all"))
    assert_close(logits, reference_forward(spec, ids), model)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[5]], ids=case_id)
def test_pieces_equal_one_pass(hybrid: Any, case: dict, backend: str) -> None:
    path, spec = hybrid(**case)
    ids = token_ids(seed=1, n=sum(PIECES))
    model = load_model(path, engine_config(backend)).runner
    state = model.new_state()
    rows, start = [], 0
    for size in PIECES:
        rows.append(as_f64(model.forward(ids[start : start + size], state, logits="all")))
        start += size
    pieces = np.concatenate(rows)
    whole = as_f64(model.forward(ids, model.new_state(), logits="all"))
    assert_close(pieces, whole, model, "pieces vs one pass:")
    assert_close(pieces, reference_forward(spec, ids), model)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("verify_rows", "keep_rows"), [(6, 3), (20, 13), (6, 0), (6, 6)])
def test_rollback_retaining_replays_the_tape(
    hybrid: Any, backend: str, verify_rows: int, keep_rows: int
) -> None:
    path, spec = hybrid(layout="next")
    ids = token_ids(seed=2, n=20 + verify_rows + 1)
    model = load_model(path, engine_config(backend)).runner
    state = model.new_state()
    model.forward(ids[:20], state, logits="none")
    cp = state.checkpoint(record=True)
    verified = as_f64(model.forward(ids[20 : 20 + verify_rows], state, logits="all"))
    state.rollback_retaining(cp, keep_rows)
    kept = ids[: 20 + keep_rows]
    assert state.tokens == kept
    nxt = ids[20 + verify_rows]  # a token the drafter did not propose
    after = as_f64(model.forward([nxt], state, logits="last")).reshape(-1)
    fresh = as_f64(model.forward([*kept, nxt], model.new_state(), logits="last"))
    assert_close(after, fresh.reshape(-1), model, "after rollback_retaining vs fresh prefill:")
    reference = reference_forward(spec, ids[: 20 + verify_rows])
    assert_close(verified, reference[20:], model, "verify rows vs reference:")


def test_tiny_weights_make_context_matter(hybrid: Any) -> None:
    """Guards the fixture: if earlier tokens barely moved the logits, a model that dropped
    its recurrent state between pieces would still pass."""
    _, spec = hybrid(layout="hf")
    ids = token_ids(seed=3)
    changed = [(ids[0] + 1) % VOCAB_SIZE, *ids[1:]]
    diff = np.abs(reference_forward(spec, ids)[-1] - reference_forward(spec, changed)[-1])
    assert diff.max() > 100 * TOLERANCE


def test_layer_types_from_full_attention_interval(hybrid: Any) -> None:
    path, spec = hybrid(layout="next")
    assert "layer_types" not in spec.config
    cfg = load_model(path, EngineConfig(backend="numpy")).config
    assert [cfg.layer_type(i) for i in range(4)] == [LINEAR, LINEAR, LINEAR, FULL]
    cfg = qwen3_5.config_from_hf(
        {**spec.config, "num_hidden_layers": 6, "full_attention_interval": 2}
    )
    assert [cfg.layer_type(i) for i in range(6)] == [LINEAR, FULL] * 3


def test_layer_types_from_list(hybrid: Any) -> None:
    path, spec = hybrid(layout="hf")
    lm = load_model(path, EngineConfig(backend="numpy"))
    assert [lm.config.layer_type(i) for i in range(4)] == [LINEAR, LINEAR, LINEAR, FULL]
    pattern = [FULL, LINEAR, LINEAR, FULL]
    cfg = qwen3_5.config_from_hf({**spec.config, "layer_types": pattern})
    assert [cfg.layer_type(i) for i in range(4)] == pattern


@pytest.mark.parametrize("layout", ["hf", "next", "mlx"])
def test_config_fields(hybrid: Any, layout: str) -> None:
    path, spec = hybrid(layout=layout)
    lm = load_model(path, EngineConfig(backend="numpy"))
    cfg = lm.model.config
    assert cfg.rotary_dim == 8  # head_dim 16 * partial_rotary_factor 0.5
    assert cfg.rope_theta == 10000.0
    assert (cfg.qk_norm, cfg.attn_output_gate) == (True, True)
    assert cfg.linear_num_value_heads == 4 and cfg.linear_conv_kernel_dim == 4
    # MLX conversions already store 1 + w: adding the offset again would double it
    assert cfg.norm_offset == (0.0 if layout == "mlx" else 1.0)
    # vision-tower and MTP tensors are dropped, every text tensor is kept
    assert cfg.extra["num_parameters"] == sum(w.size for w in spec.weights.values())


def test_canonical_names() -> None:
    name = qwen3_5.canonical_name
    assert name("model.language_model.layers.0.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert name("language_model.model.norm.weight") == "model.norm.weight"
    assert name("language_model.lm_head.scales") == "lm_head.scales"
    assert name("lm_head.weight") == "lm_head.weight"
    for dropped in (
        "model.visual.blocks.0.attn.qkv.weight",
        "vision_tower.x.weight",
        "mtp.fc.weight",
    ):
        assert name(dropped) == ""


@pytest.mark.parametrize("layout", ["hf", "next"])
def test_mixture_of_experts_is_refused(tmp_path: Path, layout: str) -> None:
    make_hybrid_dir(tmp_path, layout, num_experts=8, num_experts_per_tok=2)
    with pytest.raises(UnsupportedArchitecture, match="mixture-of-experts"):
        load_model(tmp_path, EngineConfig(backend="numpy"))
