"""A Qwen3.5 GGUF as llama.cpp's converter writes it (architecture `qwen35`), read onto the
qwen3_5 family: against transformers' float64 forward of the same checkpoint, and through
the state contracts (rollback, truncate, rollback_retaining equal a fresh prefill).

The fixture (tests/engine/fixtures/make_qwen35_gguf.py) has 2 key heads and 4 value heads, so
the converter's tiled value-head order is in play: reading the heads in HF's grouped order
instead puts the logits off by units.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from engine.errors import ModelLoadError
from engine.loader import load_model, read_gguf
from engine.models import qwen3_5, qwen3_5_gguf
from engine.models.base import FULL, LINEAR
from engine.sequence import truncate
from engine.state import SnapshotPolicy
from tests.tolerances import BACKENDS, as_f64, assert_logits_close, compute_dtype, engine_config

FIXTURE = Path(__file__).parent / "fixtures" / "qwen35_gguf"
GGUF = FIXTURE / "F32.gguf"
POLICY = SnapshotPolicy(stride=8, stride_capacity=4, marked_capacity=2)


def reference() -> list[tuple[list[int], np.ndarray]]:
    """(token ids, transformers' float64 logits at every position) per sequence."""
    data = np.load(FIXTURE / "reference.npz")
    return [([int(t) for t in data[f"ids_{i}"]], data[f"logits_{i}"]) for i in range(2)]


def assert_close(got: Any, want: Any, model: Any, what: str = "") -> None:
    reduction = model.config.hidden_size
    assert_logits_close(got, want, compute_dtype(model.ops), reduction, what)


@pytest.fixture(scope="module", params=BACKENDS)
def runner(request: pytest.FixtureRequest) -> Any:
    return load_model(GGUF, engine_config(request.param, fused=False)).runner


def test_metadata_reads_as_the_checkpoint_config() -> None:
    cfg = read_gguf(GGUF).config
    assert cfg.family == "qwen3_5"
    assert cfg.layer_types == (LINEAR, LINEAR, LINEAR, FULL)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim) == (4, 2, 16, 8)
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (2, 4)
    assert (cfg.linear_key_head_dim, cfg.linear_value_head_dim) == (16, 16)
    assert cfg.linear_conv_kernel_dim == 4
    assert cfg.norm_offset == 0.0  # the converter wrote 1 + w
    assert cfg.qk_norm and cfg.attn_output_gate and not cfg.rope_traditional
    assert cfg.extra[qwen3_5_gguf.VALUE_HEAD_ORDER] == "tiled"


def test_every_position_matches_transformers_float64(runner: Any) -> None:
    for ids, want in reference():
        got = as_f64(runner.forward(ids, runner.new_state(), logits="all"))
        assert_close(got, want, runner, f"{len(ids)} tokens:")


def test_value_heads_in_hf_order_would_be_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards the fixture: it tells the two head orders apart."""
    init = qwen3_5.GatedDeltaNet.__init__

    def grouped(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.tiled = False

    monkeypatch.setattr(qwen3_5.GatedDeltaNet, "__init__", grouped)
    model = load_model(GGUF, engine_config("numpy")).runner
    ids, want = reference()[0]
    got = as_f64(model.forward(ids, model.new_state(), logits="all"))
    assert np.abs(got - want).max() > 1.0


def test_rollback_and_truncate_equal_a_fresh_prefill(runner: Any) -> None:
    ids = reference()[0][0]  # 40 ids
    state = runner.model.new_state(POLICY)
    runner.forward(ids[:12], state, logits="none")
    cp = state.checkpoint()
    runner.forward(ids[12:30], state, logits="none")  # past a stride snapshot (16, 24)
    state.rollback(cp)
    assert state.tokens == ids[:12]
    after = as_f64(runner.forward(ids[12:20], state, logits="all"))
    fresh = as_f64(runner.forward(ids[:20], runner.new_state(), logits="all"))[12:]
    assert_close(after, fresh, runner, "after rollback vs fresh prefill:")

    runner.forward(ids[20:40], state, logits="none")
    truncate(runner, state, 27)  # through the snapshot at 24, then a replay of 3 tokens
    assert state.tokens == ids[:27]
    after = as_f64(runner.forward(ids[27:30], state, logits="all"))
    fresh = as_f64(runner.forward(ids[:30], runner.new_state(), logits="all"))[27:]
    assert_close(after, fresh, runner, "after truncate vs fresh prefill:")


@pytest.mark.parametrize(("verify_rows", "keep_rows"), [(6, 2), (20, 13), (5, 0)])
def test_rollback_retaining_equals_a_fresh_prefill(
    runner: Any, verify_rows: int, keep_rows: int
) -> None:
    ids = reference()[0][0]
    state = runner.new_state()
    runner.forward(ids[:10], state, logits="none")
    cp = state.checkpoint(record=True)
    runner.forward(ids[10 : 10 + verify_rows], state, logits="all")
    state.rollback_retaining(cp, keep_rows)
    kept = ids[: 10 + keep_rows]
    assert state.tokens == kept
    nxt = ids[-1]  # a token the verify did not hold there
    after = as_f64(runner.forward([nxt], state, logits="last")).reshape(-1)
    fresh = as_f64(runner.forward([*kept, nxt], runner.new_state(), logits="last")).reshape(-1)
    assert_close(after, fresh, runner, "after rollback_retaining vs fresh prefill:")


# -- files the converter could have written otherwise -----------------------------------


def rewrite(dst: Path, keys: dict[str, Any], tensors: dict[str, np.ndarray] | None = None) -> Path:
    """The fixture with `keys` set (None: removed) and `tensors` added."""
    reader = gguf.GGUFReader(str(GGUF))
    writer = gguf.GGUFWriter(str(dst), "qwen35")
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture" or name in keys:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub)
    for name, value in keys.items():
        if value is None:
            continue
        if isinstance(value, list):
            sub = (
                gguf.GGUFValueType.BOOL if isinstance(value[0], bool) else gguf.GGUFValueType.INT32
            )
            writer.add_key_value(name, value, gguf.GGUFValueType.ARRAY, sub_type=sub)
        elif isinstance(value, str):
            writer.add_string(name, value)
        elif isinstance(value, float):
            writer.add_float32(name, value)
        else:
            writer.add_uint32(name, int(value))
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    for name, value in (tensors or {}).items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_mtp_blocks_are_not_read_into_the_forward(tmp_path: Path) -> None:
    """A file converted with its MTP head: block_count counts the MTP block at the end (a
    full-attention block plus the nextn tensors), which the forward leaves out as HF does."""
    reader = gguf.GGUFReader(str(GGUF))
    mtp = {
        t.name.replace("blk.3.", "blk.4.", 1): np.array(t.data)
        for t in reader.tensors
        if t.name.startswith("blk.3.")
    }
    mtp["blk.4.nextn.eh_proj.weight"] = np.ones((64, 128), np.float32)
    mtp["blk.4.nextn.enorm.weight"] = np.ones(64, np.float32)
    keys = {
        "qwen35.block_count": 5,
        "qwen35.nextn_predict_layers": 1,
        "qwen35.attention.recurrent_layers": [True, True, True, False, False],
    }
    path = rewrite(tmp_path / "mtp.gguf", keys, mtp)
    with_mtp = load_model(path, engine_config("numpy")).runner
    plain = load_model(GGUF, engine_config("numpy")).runner
    assert with_mtp.model.config.num_layers == 4
    ids = reference()[1][0]
    got = as_f64(with_mtp.forward(ids, with_mtp.new_state(), logits="all"))
    want = as_f64(plain.forward(ids, plain.new_state(), logits="all"))
    assert np.array_equal(got, want)


def test_layer_types_from_full_attention_interval(tmp_path: Path) -> None:
    keys = {"qwen35.attention.recurrent_layers": None, "qwen35.full_attention_interval": 2}
    cfg = read_gguf(rewrite(tmp_path / "interval.gguf", keys)).config
    assert cfg.layer_types == (LINEAR, FULL, LINEAR, FULL)


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"qwen35.rope.dimension_sections": [2, 1, 0, 1]}, "a fourth section"),
        (
            {"qwen35.rope.scaling.type": "yarn", "qwen35.rope.scaling.factor": 4.0},
            "rope.scaling.type 'yarn'",
        ),
        ({"qwen35.attention.recurrent_layers": [True, False]}, "2 entries for 4 blocks"),
        ({"qwen35.ssm.inner_size": 66}, "ssm.inner_size 66"),
        ({"qwen35.ssm.group_count": None}, "ssm.group_count"),
    ],
)
def test_refusals_name_what_is_wrong(tmp_path: Path, keys: dict, named: str) -> None:
    with pytest.raises(ModelLoadError) as info:
        load_model(rewrite(tmp_path / "bad.gguf", keys), engine_config("numpy"))
    assert named in str(info.value)


def test_a_fused_ssm_tensor_is_refused_by_name(tmp_path: Path) -> None:
    """Qwen3-Next's fused beta|alpha projection is not read from a qwen35 file."""
    extra = {"blk.0.ssm_ba.weight": np.ones((8, 64), np.float32)}
    with pytest.raises(ModelLoadError, match="blk.0.ssm_ba.weight"):
        load_model(rewrite(tmp_path / "fused.gguf", {}, extra), engine_config("numpy"))
