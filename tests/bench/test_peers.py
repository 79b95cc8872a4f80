"""The peers a bench leaves out say why: a GGUF the converter refuses (a Qwen2 file) leaves
mlx-lm out with the converter's reason, printed and in the result, as a missing package
does, and the bench runs on without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import decode
from bench.peers import make_peers
from engine.config import EngineConfig
from tests.oracles.fixture_files import FIXTURES

REFUSAL = (
    "no MLX directory for mlx-lm: {path}: conversion to an MLX directory takes "
    "Llama, Qwen3, Qwen3.5 and Gemma 3 GGUF files, not 'qwen2'"
)


@pytest.fixture(scope="module")
def qwen2_gguf() -> Path:
    return FIXTURES / "qwen2" / "Q8_0.gguf"  # llama.cpp's own file of a tiny Qwen2


def test_make_peers_records_the_converters_refusal(qwen2_gguf: Path, tiny_llama_q4_gguf):
    runners, missing = make_peers(["mlx_lm"], qwen2_gguf, None)
    assert runners == [] and missing == {"mlx_lm": REFUSAL.format(path=qwen2_gguf)}
    # a file the converter takes, with no directory handed in: no refusal to name
    _, missing = make_peers(["mlx_lm"], tiny_llama_q4_gguf[0], None)
    assert missing == {"mlx_lm": "no converted MLX directory for mlx-lm"}


def test_decode_bench_runs_on_without_mlx_lm(qwen2_gguf: Path, capsys):
    def mlx_lm_only(model: Path, tmp: Path, n_ctx: int, names: list[str]) -> Any:
        assert "mlx_lm" in names
        return decode._real_peers(model, tmp, n_ctx, ["mlx_lm"])  # llama.cpp: its own tests

    argv = ["--model", str(qwen2_gguf), "--runs", "1", "--json", "--peers"]
    args = decode.parse_args([*argv, "--contexts", "32", "--steps", "4", "--paste-tokens", "0"])
    result = decode.run(args, EngineConfig(), peer_factory=mlx_lm_only)
    assert result["mlx_lm"] == {"missing": REFUSAL.format(path=qwen2_gguf)}
    assert set(result["ours"]) >= {"prefill_tok_s_32", "decode_tok_s_32"}
    assert f"mlx_lm: {REFUSAL.format(path=qwen2_gguf)}" in capsys.readouterr().err
