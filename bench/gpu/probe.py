"""GPU decode-step probe on a random Llama with the default model's shapes (no model file
needed): plain MLX path vs the fused kernels, eager and compiled, and the compiled step
pipelined (next step queued before the token reaches the host); plus the row-invariance
check that makes bf16 speculation exact. Prints one JSON object.

    python -m bench.gpu.probe [--steps 200] [--context 128]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import mlx.core as mx
import numpy as np

from engine.models import llama
from engine.models.base import Weights
from engine.runner import ModelRunner
from kernels.ops import make_ops

SMOLLM2 = dict(hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152)


def random_model(ops: Any, seed: int = 0) -> ModelRunner:
    """The default model's shapes with random weights, on the plain path (no fused kernels)."""
    s = SMOLLM2
    cfg = llama.ModelConfig(
        family="llama",
        hidden_size=s["hidden"],
        num_layers=s["layers"],
        num_heads=s["heads"],
        num_kv_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        intermediate_size=s["ffn"],
        vocab_size=s["vocab"],
        rope_theta=100000.0,
        rope_traditional=True,
        tie_word_embeddings=True,
    )
    key = mx.random.key(seed)
    tensors: dict[str, Any] = {}

    def normal(name: str, *shape: int, std: float = 0.02) -> None:
        nonlocal key
        key, sub = mx.random.split(key)
        tensors[name] = (std * mx.random.normal(shape, key=sub)).astype(ops.dtype)

    D, F, H, Hkv, Dh = s["hidden"], s["ffn"], s["heads"], s["kv_heads"], s["head_dim"]
    normal("model.embed_tokens.weight", s["vocab"], D, std=1.0)
    tensors["model.norm.weight"] = mx.ones((D,), dtype=ops.dtype)
    for i in range(s["layers"]):
        p = f"model.layers.{i}"
        normal(f"{p}.self_attn.q_proj.weight", H * Dh, D)
        normal(f"{p}.self_attn.k_proj.weight", Hkv * Dh, D)
        normal(f"{p}.self_attn.v_proj.weight", Hkv * Dh, D)
        normal(f"{p}.self_attn.o_proj.weight", D, H * Dh)
        normal(f"{p}.mlp.gate_proj.weight", F, D)
        normal(f"{p}.mlp.up_proj.weight", F, D)
        normal(f"{p}.mlp.down_proj.weight", D, F)
        tensors[f"{p}.input_layernorm.weight"] = mx.ones((D,), dtype=ops.dtype)
        tensors[f"{p}.post_attention_layernorm.weight"] = mx.ones((D,), dtype=ops.dtype)
    mx.eval(tensors)
    return ModelRunner(llama.build(ops, cfg, Weights(tensors, "random")))


def tok_s(model: Any, context: int, steps: int) -> tuple[float, list[int]]:
    state = model.new_state()
    rng = np.random.default_rng(0)
    logits = model.forward(rng.integers(0, 49152, context).tolist(), state)
    token = int(np.argmax(np.array(logits.astype(mx.float32))[-1]))
    out = []
    for i in range(steps + 8):
        if i == 8:
            t0 = time.perf_counter()
        logits = model.forward([token], state)
        token = int(np.argmax(np.array(logits.astype(mx.float32))[-1]))
        out.append(token)
    return steps / (time.perf_counter() - t0), out


def pipelined_tok_s(model: Any, context: int, steps: int) -> float:
    """The compiled fused step fed its own device-side argmax: no host round trip."""
    fused = model.fused
    state = model.new_state()
    rng = np.random.default_rng(0)
    logits = model.forward(rng.integers(0, 49152, context).tolist(), state)
    token = mx.argmax(logits[-1:], axis=-1).astype(mx.int32)
    kvs = list(state.layers)
    cap = 4096
    for kv in kvs:
        kv.reserve(cap)
    fn = mx.compile(fused._traceable("last"))
    buffers = [a for kv in kvs for a in (kv.keys, kv.values)]
    pos = state.offset
    pending = []
    t0 = 0.0
    for i in range(steps + 8):
        if i == 8:
            mx.eval(pending[-1])
            t0 = time.perf_counter()
        outs = fn(token, mx.array([pos], dtype=mx.int32), *buffers)
        logits, buffers = outs[0], outs[1:]
        token = mx.argmax(logits, axis=-1).astype(mx.int32)
        mx.async_eval(token)
        pending.append(token)
        if len(pending) > 2:
            int(pending[-2].item())  # the host reads a token one step behind
        pos += 1
    mx.eval(pending[-1])
    return steps / (time.perf_counter() - t0)


def row_invariance(model: Any) -> dict[str, Any]:
    state = model.new_state()
    prompt = list(range(100, 140))
    model.forward(prompt, state)
    steps = [int(t) for t in np.random.default_rng(1).integers(0, 49152, 12)]
    single = [np.array(model.forward([t], state).astype(mx.float32))[-1] for t in steps]
    state = model.new_state()
    model.forward(prompt, state)
    rows = np.array(model.forward(steps, state, logits="all"))
    diffs = [float(np.abs(rows[i] - single[i]).max()) for i in range(len(steps))]
    return {"bit_identical": all(d == 0 for d in diffs), "max_abs_diff": max(diffs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="plain and fused compiled only")
    args = ap.parse_args()
    out: dict[str, Any] = {"device": str(mx.default_device()), "mlx": mx.__version__}
    out["MLX_MAX_OPS_PER_BUFFER"] = os.environ.get("MLX_MAX_OPS_PER_BUFFER")
    ops = make_ops("mlx")
    model = random_model(ops)
    model.fused = None
    out["plain_tok_s"], plain_tokens = tok_s(model, args.context, args.steps)
    variants = [("step", True), ("layers", True)] + ([] if args.quick else [("layers", False)])
    for mode, compiled in variants:
        model.enable_fused_decode(compiled=compiled, mode=mode)
        tps, toks = tok_s(model, args.context, args.steps)
        name = "fused_step" if mode == "step" else "fused_compiled" if compiled else "fused_eager"
        out[f"{name}_tok_s"] = tps
        out[f"{name}_same_first_tokens_as_plain"] = sum(
            a == b for a, b in zip(toks, plain_tokens, strict=False)
        )
    out["row_invariance_layers"] = row_invariance(model)
    out["fused_compiled_pipelined_tok_s"] = pipelined_tok_s(model, args.context, args.steps)
    model.enable_fused_decode(mode="step")
    out["row_invariance_step"] = row_invariance(model)
    for context in (512, 2048):
        out[f"fused_step_tok_s_{context}"], toks = tok_s(model, context, args.steps)
        if context == 2048:  # attention split across blocks and combined: same tokens?
            fused, model.fused = model.fused, None
            plain_2048 = tok_s(model, context, 64)[1]
            model.fused = fused
            out["fused_step_same_first_tokens_as_plain_2048"] = sum(
                a == b for a, b in zip(toks, plain_2048, strict=False)
            )
    if args.quick:
        print(json.dumps(out))
        return
    for rows in (1, 2, 4, 8, 12, 16):
        state = model.new_state()
        model.forward(list(range(args.context)), state)
        times = []
        for _ in range(10):
            cp = state.checkpoint()
            t0 = time.perf_counter()
            model.forward([5] * rows, state, logits="all")
            times.append(time.perf_counter() - t0)
            state.rollback(cp)
        out[f"fused_step_ms_{rows}_rows"] = 1000 * float(np.median(times[2:]))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
