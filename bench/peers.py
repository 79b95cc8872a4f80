"""The peers we compare against, driven through the same small runner interface as ours:
llama.cpp (llama-cpp-python, on the same GGUF) and mlx-lm (on the GGUF converted by
engine.convert). Both are optional (`pip install -e '.[peers]'`) and imported lazily.

A runner holds one sequence. `prefill(ids)` starts afresh and returns the greedy next token,
`decode(token)` appends one token and returns the next, `truncate(n)` keeps exactly the
first n positions (as a fresh prefill of them would), `prefill_cached(ids)` reuses the
longest common prefix with what the runner holds (each peer's own prompt cache) and
returns the first token, `verify(rows)` times a batched forward of `rows` tokens with
logits for every row and undoes it (None where the peer cannot do that cheaply).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np


class PeerMissing(RuntimeError):
    """An optional peer package is not installed."""


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _import(module: str, package: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        from bench.common import peer_missing_message

        raise PeerMissing(peer_missing_message(package)) from None


class LlamaCppRunner:
    """llama.cpp through llama-cpp-python's Llama: same GGUF, the cores this process may
    use, flash attention off or on (`flash_attn`: bench/decode.py runs both and keeps the
    better figure of the two, so a ratio is against llama.cpp's best setting)."""

    name = "llama_cpp"
    n_batch = 512  # llama-cpp-python's default; a prefill is evaluated in these chunks

    def __init__(self, gguf_path: Path, n_ctx: int = 4096, flash_attn: bool = False) -> None:
        llama_cpp = _import("llama_cpp", "llama-cpp-python")
        threads = usable_cores()
        self.llm = llama_cpp.Llama(
            model_path=str(gguf_path),
            n_ctx=n_ctx,
            n_batch=self.n_batch,
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=flash_attn,
            logits_all=False,
            verbose=False,
        )
        self.setting = f"flash_attn={'on' if flash_attn else 'off'}"
        self.build = llama_cpp_build()
        self.settings = {
            "n_ctx": self.llm.n_ctx(),
            "n_batch": self.n_batch,
            "n_ubatch": self.llm.context_params.n_ubatch,
            "n_threads": threads,
            "n_threads_batch": threads,
            "flash_attn": flash_attn,
            "swa_full": bool(self.llm.context_params.swa_full),
        }

    def _greedy(self) -> int:
        # with logits_all=False only the last row has logits, and eval() does not copy them
        row = self.llm._ctx.get_logits_ith(-1)
        return int(np.argmax(np.ctypeslib.as_array(row, shape=(self.llm.n_vocab(),))))

    def prefill(self, ids: list[int]) -> int:
        self.llm.reset()
        self.llm.eval(ids)
        return self._greedy()

    def decode(self, token: int) -> int:
        self.llm.eval([token])
        return self._greedy()

    def truncate(self, n: int) -> None:
        """Keep the first n positions: eval() drops the KV cells from n_tokens on, which
        is exact (a decode after it gives the logits a fresh prefill of n tokens would)."""
        if not self.llm._ctx.kv_cache_seq_rm(-1, n, -1):
            raise RuntimeError(f"llama.cpp cannot drop its KV cache past position {n}")
        self.llm.n_tokens = n

    def prefill_cached(self, ids: list[int]) -> int:
        """Llama.generate keeps the evaluated tokens and re-evaluates only past the common
        prefix (its KV rows after it are dropped): llama.cpp's own prompt cache."""
        tokens = self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, reset=True)
        first = next(tokens)
        tokens.close()
        return int(first)

    def verify(self, rows: int) -> float | None:
        return None  # needs a second Llama with logits_all=True; not measured


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), as our C kernel defaults to."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def llama_cpp_build() -> dict[str, Any]:
    """What the installed llama.cpp was built for: its system info string and the CPU
    features it reports as compiled in (a build without AVX512 / VNNI is not llama.cpp
    at its best on a processor that has them)."""
    llama_cpp = _import("llama_cpp", "llama-cpp-python")
    raw = llama_cpp.llama_print_system_info()
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    features = [
        name.strip()
        for part in text.replace("CPU :", "|").split("|")
        if "=" in part
        for name, value in [part.split("=", 1)]
        if value.strip() == "1"
    ]
    return {"version": llama_cpp.__version__, "system_info": text.strip(), "features": features}


class MlxLmRunner:
    """mlx-lm's Llama with its KV cache, driven the way mlx_lm.generate_step does: the prompt
    but its last token in prefill_step_size chunks evaluating only the cache, then the last
    token for logits, then one token per step.

    Quantized scales and biases are cast to float32 at load: they are float16 in the file,
    and MLX's CPU backend runs float16 ~40x slower than float32 (see docs/DESIGN.md), so
    float32 is mlx-lm's best setting on this machine. On a GPU leave them as they are."""

    name = "mlx_lm"
    setting = ""  # one setting (the decode bench keys samples by engine and setting)
    prefill_step_size = 2048  # mlx_lm.generate's default

    def __init__(self, model_dir: Path, float32: bool = True) -> None:
        mlx_lm = _import("mlx_lm", "mlx-lm")
        cache_mod = _import("mlx_lm.models.cache", "mlx-lm")
        import mlx.core as mx
        from mlx.utils import tree_map

        self.mx, self.cache_mod = mx, cache_mod
        self.model, self.tokenizer = mlx_lm.load(str(model_dir))
        if float32:

            def to_f32(x: Any) -> Any:
                return x.astype(mx.float32) if x.dtype in (mx.float16, mx.bfloat16) else x

            self.model.update(tree_map(to_f32, self.model.parameters()))
        mx.eval(self.model.parameters())
        self.cache: list[Any] = cache_mod.make_prompt_cache(self.model)
        self.tokens: list[int] = []
        self.settings = {"dtype": "float32" if float32 else "as stored (float16)"}
        self.cannot_trim = ""

    def _forward(self, ids: list[int]) -> int:
        mx = self.mx
        head, last = ids[:-1], ids[-1:]
        for start in range(0, len(head), self.prefill_step_size):
            chunk = head[start : start + self.prefill_step_size]
            self.model(mx.array(chunk)[None], cache=self.cache)
            mx.eval([c.state for c in self.cache])
        logits = self.model(mx.array(last)[None], cache=self.cache)[0, -1]
        token = int(mx.argmax(logits).item())
        self.tokens += ids
        return token

    def prefill(self, ids: list[int]) -> int:
        self.cache = self.cache_mod.make_prompt_cache(self.model)
        self.tokens = []
        return self._forward(ids)

    def decode(self, token: int) -> int:
        return self._forward([token])

    def decode_many(self, token: int, steps: int) -> int:
        """`steps` greedy tokens through mlx_lm.generate_step itself (its pipelined loop:
        the next step is queued before the current token reaches the host)."""
        from mlx_lm.generate import generate_step

        mx = self.mx
        gen = generate_step(
            mx.array([token]), self.model, max_tokens=steps, prompt_cache=self.cache
        )
        produced = [int(out) for out, _ in gen]
        # the cache now holds the fed token and every produced one but the last (pending)
        self.tokens += [token, *produced[:-1]]
        return produced[-1] if produced else token

    def truncate(self, n: int) -> None:
        """Keep the first n positions: trim the cache, or prefill them afresh where this
        model's cache cannot be trimmed."""
        if self.cache_mod.can_trim_prompt_cache(self.cache):
            self.cache_mod.trim_prompt_cache(self.cache, len(self.tokens) - n)
            self.tokens = self.tokens[:n]
        else:
            self.prefill(self.tokens[:n])

    def prefill_cached(self, ids: list[int]) -> int:
        """mlx-lm's prompt cache: trim the cache back to the common prefix, then prefill
        only the rest (at least the last token, whose logits start the reply)."""
        keep = min(common_prefix(self.tokens, ids), len(ids) - 1)
        if not self.cache_mod.can_trim_prompt_cache(self.cache):
            self.cannot_trim = "mlx-lm cannot trim this model's cache: a full re-prefill"
            return self.prefill(ids)
        self.cache_mod.trim_prompt_cache(self.cache, len(self.tokens) - keep)
        self.tokens = self.tokens[:keep]
        return self._forward(ids[keep:])

    def verify(self, rows: int) -> float | None:
        """Seconds for a forward of `rows` tokens with logits for every row, then undone."""
        mx = self.mx
        ids = [self.tokens[-1]] * rows
        t0 = time.perf_counter()
        logits = self.model(mx.array(ids)[None], cache=self.cache)
        mx.eval(logits)
        elapsed = time.perf_counter() - t0
        self.cache_mod.trim_prompt_cache(self.cache, rows)
        return elapsed


def make_peers(
    names: list[str],
    gguf_path: Path,
    mlx_dir: Path | None,
    n_ctx: int = 4096,
    llama_flash_attn: tuple[bool, ...] = (False,),
) -> tuple[list[Any], dict[str, str]]:
    """Runners for the peers that are installed, and why the others are missing; llama.cpp
    once per `llama_flash_attn` value (each runner's `setting` says which)."""
    runners: list[Any] = []
    missing: dict[str, str] = {}
    for name in names:
        try:
            if name == "llama_cpp":
                runners += [LlamaCppRunner(gguf_path, n_ctx, flash) for flash in llama_flash_attn]
            elif name == "mlx_lm":
                if mlx_dir is None:
                    raise PeerMissing(_why_not_converted(gguf_path))
                import mlx.core as mx

                # float32 on the CPU (float16 is ~40x slower there); as stored on a GPU
                runners.append(MlxLmRunner(mlx_dir, float32=mx.default_device() == mx.cpu))
            else:
                raise ValueError(f"unknown peer {name!r}")
        except PeerMissing as exc:
            missing[name] = str(exc)
    return runners, missing


def _why_not_converted(gguf_path: Path) -> str:
    """Why mlx-lm has no directory: the converter's refusal of the file (a Qwen3.5 GGUF), so
    the result records why, as it records a package that is not installed."""
    from engine.convert import check_convertible
    from engine.errors import EngineError

    try:
        check_convertible(gguf_path)
    except EngineError as exc:
        return f"no MLX directory for mlx-lm: {exc}"
    return "no converted MLX directory for mlx-lm"
