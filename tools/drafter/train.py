"""Train the block drafter: generate the target's replies, train on them, export the file.

    python -m tools.drafter.train generate --model GGUF --prompts tools/drafter/prompts.npz \
        --out SEQS.npz [--limit N] [--max-new-tokens 320] [--batch-size 384] [--passes 2]
    python -m tools.drafter.train train --model GGUF --data SEQS.npz --out DIR \
        [--resume] [--minutes M] [--run-steps K] [--steps S] [...]
    python -m tools.drafter.train export --model GGUF --out DIR --file drafter.safetensors

Training: the frozen target computes its last layer's rows for each batch on the fly
(float32; TF32 matmuls on CUDA), the drafter runs under bfloat16 autocast on CUDA and
float32 on the CPU. Blocks are anchored at random reply positions; the loss is the
cross-entropy of rows 1..B-1 against the true next tokens in the draft vocabulary, rows
whose token lies outside it ignored (the file has no catch-all id to propose), weighted
exp(-(j-1)/gamma) toward the early rows as in DFlash. AdamW, linear warm-up then cosine
decay to 10%, gradient clipping. DIR/checkpoint.pt holds everything a resumed run needs
to continue exactly: the weights, the optimizer, the step and the settings (batches are
drawn from (seed, step), so no sampler state is saved).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tools.drafter import data
from tools.drafter.export import export_drafter
from tools.drafter.model import BlockDrafter, DrafterConfig, init_weights
from tools.drafter.safetensors_io import read_drafter_file
from tools.drafter.target import Target

CHECKPOINT = "checkpoint.pt"
# the target's greedy replies to the bench's held-out chats (engine_accuracy.py --sequences)
EVAL_CHAT = Path(__file__).parent / "heldout_greedy.npz"


@dataclass(frozen=True)
class Settings:
    """Everything that shapes the run's trajectory; a resumed run keeps the saved ones."""

    layers: int = 2
    intermediate: int = 1536
    block: int = 16
    vocab_size: int = 8192
    batch: int = 32  # sequences per step
    anchors: int = 32  # blocks per sequence
    max_len: int = 768
    steps: int = 3000  # the schedule's length
    lr: float = 6e-4
    warmup: int = 100
    weight_decay: float = 0.01
    clip: float = 1.0
    decay_gamma: float = 7.0  # 0: every row weighs the same
    heldout_fraction: float = 0.02
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.anchors < 1 or self.warmup < 0:
            raise ValueError(f"steps, batch and anchors must be positive: {self}")
        if not 0 <= self.heldout_fraction < 1:
            raise ValueError(f"heldout_fraction {self.heldout_fraction} is not in [0, 1)")

    def lr_at(self, step: int) -> float:
        warm = min(1.0, (step + 1) / self.warmup) if self.warmup else 1.0
        progress = min(1.0, step / self.steps)
        return self.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def drafter_config(target: dict, s: Settings, vocab_size: int) -> DrafterConfig:
    """The drafter's shape: attention and numerics from the target, the rest from `s`."""
    return DrafterConfig(
        hidden=target["hidden_size"],
        num_layers=s.layers,
        num_heads=target["num_attention_heads"],
        num_kv_heads=target["num_key_value_heads"],
        head_dim=target["head_dim"],
        intermediate=s.intermediate,
        block=s.block,
        rope_base=target["rope_theta"],
        rms_eps=target["rms_norm_eps"],
        vocab_size=vocab_size,
    )


def row_weights(settings: Settings, device) -> torch.Tensor:
    """[B-1] loss weight of rows 1..B-1."""
    j = torch.arange(settings.block - 1, dtype=torch.float32, device=device)
    return torch.exp(-j / settings.decay_gamma) if settings.decay_gamma > 0 else torch.ones_like(j)


def block_loss(logits, targets, weights) -> torch.Tensor:
    """Weighted mean cross-entropy over the supervised rows; logits [..., B-1, N]."""
    ce = F.cross_entropy(
        logits.float().flatten(0, -2), targets.flatten(), ignore_index=-100, reduction="none"
    )
    w = weights.expand_as(targets).flatten() * (targets.flatten() != -100)
    return (ce * w).sum() / w.sum().clamp_min(1.0)


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        saved = None
        if args.resume and (self.out / CHECKPOINT).exists():
            saved = torch.load(self.out / CHECKPOINT, map_location="cpu", weights_only=True)
        self.settings = Settings(**saved["settings"]) if saved else _settings_from(args)
        if saved and args.extend_to:  # a longer schedule: no longer an unbroken run's
            self.settings = replace(self.settings, steps=args.extend_to)
        self.target = Target(args.model, str(self.device))
        self.seqs = data.Sequences.load(args.data)
        chat = args.eval_data
        self.eval_chat = data.Sequences.load(chat) if chat and Path(chat).exists() else None
        s = self.settings
        self.train_idx, self.held_idx = data.split_heldout(
            self.seqs.prompt_index, s.heldout_fraction, s.seed
        )
        vocab, self.coverage = data.draft_vocabulary(self.seqs, self.train_idx, s.vocab_size)
        vocab_t = saved["drafter"]["vocab"] if saved else torch.from_numpy(vocab)
        cfg = drafter_config(self.target.config, s, len(vocab_t))
        self.drafter = BlockDrafter(cfg, self.target.embedding, vocab_t)
        init_weights(self.drafter, s.seed)
        self.drafter.to(self.device)
        self.vocab_index = data.vocab_lookup(vocab_t.numpy(), self.target.config["vocab_size"])
        decay = [p for p in self.drafter.parameters() if p.dim() == 2]
        no_decay = [p for p in self.drafter.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": s.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=s.lr,
            betas=(0.9, 0.95),
        )
        self.step, self.trained_tokens = 0, 0
        if saved:
            self.drafter.load_state_dict(saved["drafter"])
            self.optimizer.load_state_dict(saved["optimizer"])
            self.step, self.trained_tokens = saved["step"], saved["trained_tokens"]
        self.weights = row_weights(s, self.device)

    def autocast(self):
        return torch.autocast("cuda", torch.bfloat16, enabled=self.device.type == "cuda")

    def batch(
        self, indices: np.ndarray, rng: np.random.Generator, seqs: data.Sequences | None = None
    ) -> tuple[data.Batch, torch.Tensor]:
        s, seqs = self.settings, self.seqs if seqs is None else seqs
        batch = data.make_batch(seqs, indices, self.vocab_index, s.block, s.anchors, s.max_len, rng)
        return batch, self.target.captures(batch.tokens)

    def train_step(self) -> float:
        s = self.settings
        rng = np.random.default_rng([s.seed, 2, self.step])
        indices = rng.choice(self.train_idx, size=s.batch, replace=len(self.train_idx) < s.batch)
        batch, captures = self.batch(indices, rng)
        dev = self.device
        with self.autocast():
            logits = self.drafter.train_forward(
                captures, batch.tokens.to(dev), batch.anchors.to(dev)
            )
        loss = block_loss(logits, batch.targets.to(dev), self.weights)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), s.clip)
        for group in self.optimizer.param_groups:
            group["lr"] = s.lr_at(self.step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.trained_tokens += batch.num_tokens
        return loss.item()

    @torch.no_grad()
    def evaluate(self, seqs: data.Sequences | None = None) -> dict:
        """Per-row top-1 accuracy and the mean acceptance length (1 + the leading run of
        correct rows, a greedy verify's tokens per round) on the held-out sequences (or on
        all of `seqs`), at anchors fixed for the whole run."""
        s = self.settings
        rng = np.random.default_rng([s.seed, 3])
        indices = self.held_idx if seqs is None else np.arange(len(seqs))
        correct = torch.zeros(s.block - 1)
        counted = torch.zeros(s.block - 1)
        runs, blocks = 0.0, 0
        for b0 in range(0, len(indices), s.batch):
            batch, captures = self.batch(indices[b0 : b0 + s.batch], rng, seqs)
            with self.autocast():
                logits = self.drafter.train_forward(
                    captures, batch.tokens.to(self.device), batch.anchors.to(self.device)
                )
            targets = batch.targets
            hit = (logits.argmax(-1).cpu() == targets) & (targets != -100)
            valid = targets != -100
            correct += hit.flatten(0, 1).sum(0)
            counted += valid.flatten(0, 1).sum(0)
            has_rows = valid[..., 0]
            runs += float(hit.long().cumprod(-1).sum(-1)[has_rows].sum())
            blocks += int(has_rows.sum())
        accuracy = (correct / counted.clamp_min(1)).tolist()
        return {
            "acc": [round(a, 4) for a in accuracy],
            "acceptance": round(1 + runs / max(blocks, 1), 3),
        }

    def evaluations(self) -> dict:
        """`eval` on the held-out slice; `eval_chat` on --eval-data (the engine's greedy
        replies to bench/heldout_prompts.json, unlike any training prompt), when given."""
        out = {"eval": self.evaluate()}
        if self.eval_chat is not None:
            out["eval_chat"] = self.evaluate(self.eval_chat)
        return out

    def save(self) -> None:
        state = {
            "drafter": self.drafter.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "trained_tokens": self.trained_tokens,
            "settings": asdict(self.settings),
            "target_check": self.target.check,
            "coverage": self.coverage,
        }
        tmp = self.out / (CHECKPOINT + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.out / CHECKPOINT)  # a run killed mid-save keeps the last one

    def log(self, record: dict) -> None:
        print(json.dumps(record), flush=True)
        with open(self.out / "log.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def run(self) -> None:
        args, s = self.args, self.settings
        started = time.time()
        n_train = sum(len(self.seqs.reply(i)) for i in self.train_idx)
        self.log({"event": "start", "step": self.step, "device": str(self.device),
                  "train_seqs": len(self.train_idx), "heldout_seqs": len(self.held_idx),
                  "train_reply_tokens": n_train, "vocab": self.drafter.cfg.vocab_size,
                  "coverage": round(self.coverage, 4), "settings": asdict(s)})  # fmt: skip
        first, losses = self.step, []
        while self.step < s.steps and self.step - first < args.run_steps:
            if args.minutes and time.time() - started > args.minutes * 60:
                break
            losses.append(self.train_step())
            if self.step % args.log_every == 0:
                rate = (self.step - first) / (time.time() - started)
                self.log({"step": self.step, "loss": round(float(np.mean(losses)), 4),
                          "lr": s.lr_at(self.step - 1), "steps_per_s": round(rate, 2)})  # fmt: skip
                losses = []
            if self.step % args.eval_every == 0:
                self.log({"step": self.step, **self.evaluations()})
            if self.step % args.save_every == 0:
                self.save()
        self.save()
        self.log({"event": "stop", "step": self.step, **self.evaluations(),
                  "seconds": round(time.time() - started, 1)})  # fmt: skip


def _settings_from(args: argparse.Namespace) -> Settings:
    return Settings(**{f.name: getattr(args, f.name) for f in fields(Settings)})


def cmd_generate(args: argparse.Namespace) -> None:
    from tools.drafter.generate import generate_replies

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    target = Target(args.model, device)
    prompts = data.load_prompts(args.prompts)[: args.limit or None]
    seqs = generate_replies(
        target,
        prompts,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        passes=args.passes,
        greedy_every=args.greedy_every,
        seed=args.seed,
    )
    seqs.save(args.out)
    replies = seqs.lengths() - seqs.reply_start
    ended = sum(int(seqs.reply(i)[-1] == target.eos_id) for i in range(len(seqs)))
    print(f"{len(seqs)} sequences, {int(replies.sum())} reply tokens (mean {replies.mean():.0f}), "
          f"{ended} ended at EOS -> {args.out}")  # fmt: skip


def cmd_export(args: argparse.Namespace) -> None:
    saved = torch.load(Path(args.out) / CHECKPOINT, map_location="cpu", weights_only=True)
    target = Target(args.model, "cpu")
    if saved["target_check"] != target.check:
        raise SystemExit(f"{args.model} is not the target this checkpoint was trained on")
    s = Settings(**saved["settings"])
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
    digest = export_drafter(
        drafter, args.file, target_check=target.check, target_vocab=target.config["vocab_size"],
        trained_tokens=saved["trained_tokens"], steps=saved["step"], notes=notes,
    )  # fmt: skip
    tensors, meta = read_drafter_file(args.file)
    size = Path(args.file).stat().st_size
    print(f"{args.file}: {size / 2**20:.2f} MiB, {len(tensors)} tensors, step {meta['steps']}, "
          f"vocab {len(tensors['vocab'])}\nsha256 {digest}")  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="replies from the target for the prompt set")
    gen.add_argument("--prompts", type=Path, default=Path(__file__).parent / "prompts.npz")
    gen.add_argument("--limit", type=int, default=0, help="only the first N prompts (0: all)")
    gen.add_argument("--max-new-tokens", type=int, default=320)
    gen.add_argument("--batch-size", type=int, default=384)
    gen.add_argument("--passes", type=int, default=2, help="replies per prompt")
    gen.add_argument(
        "--greedy-every", type=int, default=4, help="every Nth prompt of pass 0 greedy"
    )
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--out", type=Path, required=True)
    tr = sub.add_parser("train", help="train (or --resume) the drafter, checkpoints in --out")
    tr.add_argument("--data", type=Path, required=True)
    tr.add_argument("--out", type=Path, required=True)
    tr.add_argument("--resume", action="store_true", help="continue DIR's checkpoint, if any")
    tr.add_argument("--minutes", type=float, default=0, help="stop and save after M minutes")
    tr.add_argument("--run-steps", type=int, default=1 << 30, help="at most K steps this run")
    tr.add_argument(
        "--extend-to", type=int, default=0, help="on --resume: the schedule's new length"
    )
    tr.add_argument(
        "--eval-data", default=str(EVAL_CHAT), help="sequences also evaluated ('': none)"
    )
    tr.add_argument("--log-every", type=int, default=20)
    tr.add_argument("--eval-every", type=int, default=200)
    tr.add_argument("--save-every", type=int, default=500)
    for f in fields(Settings):
        tr.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    ex = sub.add_parser("export", help="the safetensors file of DIR's checkpoint")
    ex.add_argument("--out", type=Path, required=True, help="the training DIR")
    ex.add_argument("--file", type=Path, required=True)
    for command in (gen, tr, ex):
        command.add_argument("--model", type=Path, required=True, help="the target GGUF")
        command.add_argument(
            "--device", default=None, help="cuda or cpu (default: cuda if present)"
        )
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    torch.manual_seed(0)
    if args.command == "generate":
        cmd_generate(args)
    elif args.command == "train":
        Trainer(args).run()
    else:
        cmd_export(args)


if __name__ == "__main__":
    main()
