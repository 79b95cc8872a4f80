"""`python -m engine score` and `python -m engine perplexity`: a model loaded in this
process (no engine thread: nothing streams), the arithmetic in engine/scoring.py."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from engine.config import EngineConfig
from engine.errors import EngineError
from engine.loader import LoadedModel, load_model
from engine.model_catalog import DEFAULT, StagePrinter, resolve_model
from engine.scoring import CompactLogits, iter_logits, perplexity


def _fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _load(args: argparse.Namespace, config: EngineConfig) -> LoadedModel:
    path = resolve_model(args.model or DEFAULT.name, StagePrinter())
    return load_model(path, config)


def run_score(args: argparse.Namespace, config: EngineConfig) -> int:
    try:
        ids = np.load(args.ids_file)
    except (OSError, ValueError) as exc:
        return _fail(f"could not read token ids from {args.ids_file} ({exc})")
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer) or ids.size == 0:
        return _fail(
            f"{args.ids_file} holds a {ids.dtype} array of shape {ids.shape}; score needs one "
            "non-empty row of integer token ids"
        )
    try:
        loaded = _load(args, config)
    except EngineError as exc:
        return _fail(str(exc), 1)
    num_vocab, context = loaded.config.vocab_size, loaded.config.context_length
    bad = ids[(ids < 0) | (ids >= num_vocab)]
    if bad.size:
        return _fail(
            f"token id {int(bad[0])} is outside the model's vocabulary (0..{num_vocab - 1})"
        )
    if ids.size > context:
        return _fail(f"{ids.size} token ids, but the model holds {context} positions")
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp.npy")
    try:
        logits = np.lib.format.open_memmap(
            tmp, mode="w+", dtype=np.float32, shape=(ids.size, num_vocab)
        )
        done = 0
        for block in iter_logits(loaded.runner, ids.tolist()):
            logits[done : done + len(block)] = block
            done += len(block)
        logits.flush()
        del logits
        os.replace(tmp, out)  # a failure leaves no half-written file under the name asked for
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        return _fail(f"could not write {out} ({exc})", 1)
    summary = {"out": str(out), "positions": int(ids.size), "vocab": int(num_vocab)}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"wrote the logits of {ids.size} positions x {num_vocab} to {out}", file=sys.stderr)
    return 0


def run_perplexity(args: argparse.Namespace, config: EngineConfig) -> int:
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return _fail(f"could not read {args.file} as UTF-8 text ({exc})")
    base = None
    if args.kl_base:
        try:
            base = CompactLogits.load(args.kl_base)
        except (OSError, ValueError, KeyError) as exc:
            return _fail(f"could not read the base logits {args.kl_base} ({exc})")
    try:
        loaded = _load(args, config)
    except EngineError as exc:
        return _fail(str(exc), 1)
    if args.ctx > loaded.config.context_length:
        return _fail(
            f"--ctx {args.ctx} is past the model's {loaded.config.context_length} positions"
        )
    tokenizer = loaded.tokenizer
    try:
        ids = tokenizer.encode(text, add_special=True)
    except EngineError as exc:  # a folder without tokenizer.json takes ids only
        return _fail(str(exc))
    bos = tokenizer.bos_id if tokenizer.add_bos else None
    try:
        result = perplexity(loaded.runner, ids, args.ctx, bos, base)
    except ValueError as exc:
        return _fail(str(exc))
    if args.save_logits and result.compact is not None:
        result.compact.save(args.save_logits)
    figures = {
        "perplexity": result.perplexity,
        "mean_nll": result.mean_nll,
        "num_tokens": result.num_tokens,
        "num_scored": result.num_scored,
        "num_chunks": result.num_chunks,
        "ctx": result.ctx,
        "definition": "llama-perplexity: chunks of ctx, the second half of each scored",
        "mean_kl": result.mean_kl,
        "top1_agreement": result.top1_agreement,
    }
    if args.json:
        print(json.dumps(figures))
        return 0
    print(
        f"perplexity {result.perplexity:.4f} over {result.num_scored} tokens "
        f"({result.num_chunks} chunks of {result.ctx}, the second half of each scored)"
    )
    if result.mean_kl is not None and result.top1_agreement is not None:
        print(
            f"mean KL divergence {result.mean_kl:.6f}, top-1 agreement "
            f"{100 * result.top1_agreement:.2f}% (against {args.kl_base})"
        )
    return 0
