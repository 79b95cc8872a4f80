"""train.py's `generate` and `export` steps (`prompts` is in self_prompts.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from tools.drafter import data
from tools.drafter.export import export_drafter
from tools.drafter.model import BlockDrafter
from tools.drafter.safetensors_io import read_drafter_file
from tools.drafter.target import Target

CHECKPOINT = "checkpoint.pt"
BEST = "best.pt"  # the weights of the best eval_chat so far, export-able as the last are


def load_prompt_files(paths: list[Path], passes: list[int]) -> tuple[list[np.ndarray], list[int]]:
    """Every file's prompts, in order (prompt_index counts across files), and the number
    of replies each gets: `passes` one value for all files or one per file."""
    if len(passes) not in (1, len(paths)):
        raise SystemExit(f"--passes: one value or one per prompts file, not {passes}")
    prompts, per_prompt = [], []
    for n, path in enumerate(paths):
        got = data.load_prompts(path)
        prompts += got
        per_prompt += [passes[0] if len(passes) == 1 else passes[n]] * len(got)
    return prompts, per_prompt


def cmd_generate(args: argparse.Namespace) -> None:
    from tools.drafter.generate import generate_replies

    started = time.time()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    target = Target(args.model, device)
    prompts, passes = load_prompt_files(list(args.prompts), list(args.passes))
    limit = args.limit or len(prompts)
    seqs = generate_replies(
        target,
        prompts[:limit],
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        passes=passes[:limit] if len(set(passes)) > 1 else passes[0],
        greedy_every=args.greedy_every,
        seed=args.seed,
        chunk=args.chunk,
        state=args.state,
        deadline=started + args.minutes * 60 if args.minutes else None,
    )
    if seqs is None:
        print(f"generate: incomplete after {time.time() - started:.0f} s; run again to go on")
        return
    seqs.save(args.out)
    replies = seqs.lengths() - seqs.reply_start
    ended = sum(int(seqs.reply(i)[-1] == target.eos_id) for i in range(len(seqs)))
    print(f"{len(seqs)} sequences, {int(replies.sum())} reply tokens (mean {replies.mean():.0f}), "
          f"{ended} ended at EOS, {time.time() - started:.0f} s -> {args.out}")  # fmt: skip


def cmd_merge(args: argparse.Namespace) -> None:
    """`merge`: sequences files in one, prompt indices as they are (each file's replies
    answer prompts counted over the same prompt files: a grown set's `generate` takes
    every earlier file with --passes 0, so its indices follow the earlier ones)."""
    from tools.drafter.generate import save_atomic

    parts = [data.Sequences.load(path) for path in args.data]
    merged = data.concatenate(parts)
    save_atomic(merged, Path(args.out))
    print(f"{len(merged)} sequences ({' + '.join(str(len(p)) for p in parts)}) -> {args.out}")


def cmd_export(args: argparse.Namespace) -> None:
    from tools.drafter.settings import LEGACY_SETTINGS, Settings, drafter_config

    name = BEST if args.best else CHECKPOINT
    saved = torch.load(Path(args.out) / name, map_location="cpu", weights_only=True)
    target = Target(args.model, "cpu")
    if saved["target_check"] != target.check:
        raise SystemExit(f"{args.model} is not the target this checkpoint was trained on")
    s = Settings(**{**LEGACY_SETTINGS, **saved["settings"]})
    vocab = saved["drafter"]["vocab"]
    cfg = drafter_config(target.config, s, len(vocab))
    drafter = BlockDrafter(cfg, target.embedding, vocab)
    drafter.load_state_dict(saved["drafter"])
    notes = (
        f"DFlash-style block drafter for {Path(args.model).name}, trained by "
        f"tools/drafter/train.py on replies the target generated; the draft vocabulary "
        f"covers {saved['coverage']:.4f} of the training replies' tokens; "
        f"settings {json.dumps(saved['settings'])}"
    )
    if "eval" in saved:
        notes += f"; {name} at step {saved['step']}: eval_chat {json.dumps(saved['eval'])}"
    digest = export_drafter(
        drafter, args.file, target_check=target.check, target_vocab=target.config["vocab_size"],
        trained_tokens=saved["trained_tokens"], steps=saved["step"], notes=notes,
    )  # fmt: skip
    tensors, meta = read_drafter_file(args.file)
    size = Path(args.file).stat().st_size
    print(f"{args.file}: {size / 2**20:.2f} MiB, {len(tensors)} tensors, {name} step "
          f"{meta['steps']}, vocab {len(tensors['vocab'])}\nsha256 {digest}")  # fmt: skip
