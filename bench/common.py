"""What every benchmark shares: the machine and versions, median/min/max over runs, the
prompt text, results files, and a random-weight Qwen3.5-style hybrid model for edit timings.

Benchmarks are not tests: they print figures and write JSON under results/; the docs quote
the figures with the command that produced them.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

# the machine and versions live in bench/machine.py; every benchmark reaches them here
from bench.machine import PEER_PACKAGES, machine, versions, warn_if_busy
from engine.config import EngineConfig

__all__ = ["PEER_PACKAGES", "machine", "versions", "warn_if_busy"]

RESULTS_DIR = Path("results")

# -- the engine configuration -------------------------------------------------------------


def engine_config(config: EngineConfig | None, backend: str | None) -> EngineConfig:
    """This run's engine configuration: `config` from bench/__main__.py (None: the
    BRANCHCHAT_* variables), with the --backend flag, when given, over it."""
    config = config or EngineConfig.from_environment()
    return replace(config, backend=backend) if backend else config


# -- statistics ----------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of a run's samples (the figure is the median)."""
    return {
        "median": float(statistics.median(values)),
        "min": float(min(values)),
        "max": float(max(values)),
    }


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def rounded(x: Any, digits: int = 4) -> Any:
    """Round floats (recursively) so the JSON stays readable."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [rounded(v, digits) for v in x]
    return x


# -- results -------------------------------------------------------------------------------


def write_results(name: str, payload: dict[str, Any], directory: Path = RESULTS_DIR) -> Path:
    """Write results/<name>-<UTC timestamp>.json and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = directory / f"{name}-{stamp}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def report(
    name: str,
    result: dict[str, Any],
    as_json: bool,
    print_table: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """Write the result file, then print ONE JSON object or the readable table."""
    path = write_results(name, result)
    if as_json:
        print(json.dumps(result))
    else:
        if print_table is not None:
            print_table(result)
        print(f"wrote {path}")
    return 0


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def peer_missing_message(package: str) -> str:
    return (
        f"{package} is not installed, so it is left out. Install the peers with "
        "`pip install -e '.[peers]'` (llama-cpp-python builds from source)."
    )


# -- the default model and prompt text ------------------------------------------------------


def default_model() -> Path:
    from engine.default_model import ensure_default_model

    # progress goes to stderr: stdout carries the --json object
    return ensure_default_model(lambda msg: print(msg, file=sys.stderr, flush=True))


def model_file(name_or_path: str | None) -> Path:
    """--model's file: a path, a shipped model's name (fetched when missing), or the default."""
    if not name_or_path:
        return default_model()
    from engine.model_catalog import resolve_model

    return resolve_model(name_or_path, lambda msg, _done: print(msg, file=sys.stderr, flush=True))


def model_info(path: Path) -> dict[str, Any]:
    return {"path": str(path), "name": path.name, "bytes": path.stat().st_size}


def converted_default_model(directory: Path, gguf: Path | None = None) -> Path:
    """The default model (or `gguf`) converted to an MLX directory (mlx-lm's input) under
    directory.

    Converted afresh on every run (~2 s for the default model), so a figure never comes
    from a stale conversion."""
    from engine.convert import convert_gguf

    source = gguf or default_model()
    return convert_gguf(source, directory / f"{source.stem}-mlx")


_VOCABULARY = (
    "the model reads every token of the conversation once and keeps its keys and values so "
    "that a later request can reuse them when the text before an edit point has not changed "
    "river mountain garden window kitchen market station library harbour village forest "
    "yellow quiet early bright careful simple honest rapid gentle narrow ancient modern "
    "explain compare measure describe improve borrow travel remember follow prepare "
    "because although whenever unless while after before during between around"
)
_WORDS = _VOCABULARY.split()


def prose(num_words: int, seed: int) -> str:
    """Deterministic English-like filler text of about num_words words."""
    rng = random.Random(seed)
    sentences = []
    words = 0
    while words < num_words:
        n = rng.randint(8, 18)
        sentence = " ".join(rng.choice(_WORDS) for _ in range(n))
        sentences.append(sentence.capitalize() + ".")
        words += n
    return " ".join(sentences)


def prompt_ids(tokenizer: Any, num_tokens: int, seed: int = 0) -> list[int]:
    """Exactly num_tokens ids of prose (no special tokens), the same for every engine."""
    ids: list[int] = []
    chunk = 0
    while len(ids) < num_tokens:
        ids += tokenizer.encode(prose(400, seed * 1000 + chunk) + "\n")
        chunk += 1
    return ids[:num_tokens]


def conversation(num_turns: int, words_per_message: int, seed: int = 0) -> list[tuple[str, str]]:
    """(role, content) pairs: a system message, then alternating user / assistant turns."""
    turns = [("system", "You are a helpful assistant. Answer carefully and briefly.")]
    for i in range(num_turns):
        turns.append(("user", f"Question {i + 1}: " + prose(words_per_message // 3, seed + i)))
        turns.append(("assistant", prose(words_per_message, seed + 100 + i)))
    return turns


# -- a random-weight Qwen3.5-style hybrid (3 Gated DeltaNet : 1 gated attention) ------------

HYBRID_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "architectures": ["Qwen3_5ForCausalLM"],
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 1536,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000000.0,
    "partial_rotary_factor": 0.25,
    "max_position_embeddings": 8192,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "torch_dtype": "float16",
}


def write_hybrid_model(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """The small Qwen3.5-style hybrid (HYBRID_CONFIG) with the default model's tokenizer."""
    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    import mlx.core as mx

    write_random_hybrid(directory, {**HYBRID_CONFIG, "vocab_size": vocab}, mx.float16, seed)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, directory / name)
    return directory


def write_random_hybrid(directory: Path, config: dict[str, Any], dtype: Any, seed: int) -> Path:
    """A Qwen3.5 text checkpoint in the official HF layout (zero-centred norms, conv1d
    (C, 1, K), unfused in_proj_qkv | z | b | a) with random weights drawn by MLX on its
    default device (fast for GPU-sized shapes), plus its config.json."""
    import mlx.core as mx

    c = {
        "model_type": "qwen3_5_text",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "max_position_embeddings": 32768,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "tie_word_embeddings": True,
        **config,
    }
    c["layer_types"] = [
        "full_attention" if (i + 1) % c["full_attention_interval"] == 0 else "linear_attention"
        for i in range(c["num_hidden_layers"])
    ]
    D, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    key = mx.random.key(seed)

    def normal(*shape: int, std: float = 0.02, mean: float = 0.0) -> mx.array:
        nonlocal key
        key, sub = mx.random.split(key)
        return (mean + std * mx.random.normal(shape, key=sub)).astype(dtype)

    w = {"model.embed_tokens.weight": normal(V, D), "model.norm.weight": normal(D, std=0.1)}
    for i, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = normal(D, std=0.1)
        w[p + "post_attention_layernorm.weight"] = normal(D, std=0.1)
        if kind == "full_attention":
            w[p + "self_attn.q_proj.weight"] = normal(2 * H * hd, D)  # [query | gate] per head
            w[p + "self_attn.k_proj.weight"] = normal(KV * hd, D)
            w[p + "self_attn.v_proj.weight"] = normal(KV * hd, D)
            w[p + "self_attn.o_proj.weight"] = normal(D, H * hd)
            w[p + "self_attn.q_norm.weight"] = normal(hd, std=0.1)
            w[p + "self_attn.k_norm.weight"] = normal(hd, std=0.1)
        else:
            a = p + "linear_attn."
            conv_dim = 2 * nk * dk + nv * dv
            w[a + "in_proj_qkv.weight"] = normal(conv_dim, D)
            w[a + "in_proj_z.weight"] = normal(nv * dv, D)
            w[a + "in_proj_b.weight"] = normal(nv, D)
            w[a + "in_proj_a.weight"] = normal(nv, D)
            w[a + "conv1d.weight"] = normal(conv_dim, 1, K, std=0.3)
            w[a + "A_log"] = mx.log(mx.random.uniform(0.05, 1.0, (nv,))).astype(dtype)
            w[a + "dt_bias"] = normal(nv, std=0.5)
            w[a + "norm.weight"] = normal(dv, std=0.1, mean=1.0)
            w[a + "out_proj.weight"] = normal(D, nv * dv)
        w[p + "mlp.gate_proj.weight"] = normal(F, D)
        w[p + "mlp.up_proj.weight"] = normal(F, D)
        w[p + "mlp.down_proj.weight"] = normal(D, F)
    directory.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(directory / "model.safetensors"), w, {"format": "pt"})
    (directory / "config.json").write_text(json.dumps(c, indent=2))
    return directory
