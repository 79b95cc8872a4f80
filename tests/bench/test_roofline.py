"""bench/roofline.py: the bytes a decode step reads, and decode as a share of bandwidth."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import decode, roofline
from bench.shapes import SHAPES
from bench.shapes_gguf import tensor_plan, write_gguf
from engine.config import EngineConfig
from engine.models.base import ModelConfig


@pytest.mark.parametrize(("name", "tied"), [("tiny-llama", False), ("tiny-qwen3", True)])
def test_weights_count_one_embedding_row_unless_the_table_is_the_head(
    name: str, tied: bool, tmp_path: Path
) -> None:
    shape = SHAPES[name]
    plan = {t.name: t.nbytes for t in tensor_plan(shape)}
    assert ("output.weight" not in plan) == tied
    whole = sum(plan.values())
    embed = plan["token_embd.weight"]
    want = whole if tied else whole - embed + embed // shape.vocab_size
    assert roofline.weight_bytes(write_gguf(shape, tmp_path / f"{name}.gguf")) == want


def test_state_bytes_per_layer_kind() -> None:
    cfg = ModelConfig(
        family="test",
        hidden_size=64,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=100,
        sliding_window=100,
        layer_types=("full_attention", "sliding_attention", "linear_attention"),
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=12,
    )
    kv_row = 2 * 2 * 16 * 2  # K and V, 2 heads of 16, 2 bytes
    recurrent = 2 * 4 * 12 * 8 * 4  # read and written, 4 value heads of 12 x 8, float32
    assert roofline.state_bytes(cfg, 1000) == kv_row * 1000 + kv_row * 100 + recurrent
    assert roofline.state_bytes(cfg, 50) == kv_row * 50 * 2 + recurrent


def test_the_decode_bench_gives_each_engines_share_of_the_bandwidth(
    tiny_llama_q4_gguf: tuple[Path, object],
) -> None:
    gguf, _ = tiny_llama_q4_gguf
    argv = ["--model", str(gguf), "--runs", "1", "--json", "--contexts", "32,64", "--steps", "4"]
    args = decode.parse_args([*argv, "--paste-tokens", "0", "--bandwidth", "1e11", "--peers"])

    def no_peers(*_args: object) -> tuple[list, dict[str, str]]:
        return [], {"llama_cpp": "left out by the test", "mlx_lm": "left out by the test"}

    result = decode.run(args, EngineConfig(backend="numpy"), peer_factory=no_peers)
    roof = result["roofline"]
    assert roof["bandwidth_bytes_per_s"] == 1e11
    for context in (32, 64):
        step = roof["step_bytes"][context]
        assert step > roofline.weight_bytes(gguf)  # the K/V rows come on top
        share = result["ours"][f"decode_tok_s_{context}"] * step / 1e11
        assert roof["fraction"]["ours"][context] == pytest.approx(share, rel=1e-3)
        assert roof["limit_tok_s"][context] == pytest.approx(1e11 / step, rel=1e-3)
    assert set(roof["fraction"]) == {"ours"}  # a peer left out gets no empty column
    cpu = EngineConfig(backend="numpy")  # on a GPU machine too: EngineConfig() would be MLX's
    plain = decode.run(decode.parse_args([*argv, "--paste-tokens", "0"]), cpu)
    assert "roofline" not in plain  # a CPU's bandwidth is not assumed
