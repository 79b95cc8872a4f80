"""Train the block drafter: prompts and replies from the target, training, the file.

    python -m tools.drafter.train prompts --model GGUF --count N --out SELF.npz \
        [--state DIR] [--minutes M] [--chunk 1024] [--batch-size 1024] [--max-turn-tokens 128]
    python -m tools.drafter.train generate --model GGUF --prompts P.npz [SELF.npz ...] \
        --out SEQS.npz [--passes 2 [1 ...]] [--state DIR] [--minutes M] [--chunk 1536] \
        [--limit N] [--max-new-tokens 320] [--batch-size 1536]
    python -m tools.drafter.train train --model GGUF --data SEQS.npz --out DIR \
        [--resume] [--minutes M] [--run-steps K] [--steps S] [--distill [W] | --hard-labels]
        [--patience E] [...]
    python -m tools.drafter.train merge --data SEQS.npz MORE.npz --out ALL.npz
    python -m tools.drafter.train export --model GGUF --out DIR --file drafter.safetensors [--best]

Training: the frozen target computes its last layer's rows for each batch on the fly
(float32; TF32 matmuls on CUDA), the drafter runs under bfloat16 autocast on CUDA and
float32 on the CPU. Blocks are anchored at random reply positions; the loss (losses.py)
over rows 1..B-1 is the KL from the target's own next-token distribution on the draft
vocabulary (`distill` 1, the default of a fresh run: from the same forward that gives
the captures), the cross-entropy against the true next tokens (`distill` 0,
--hard-labels) or a mix; rows whose token lies outside the vocabulary are ignored (the
file has no catch-all id to propose), rows weighted exp(-(j-1)/gamma) toward the early
ones as in DFlash. AdamW, linear warm-up then cosine decay to 10%, gradient clipping.
DIR/checkpoint.pt holds everything a resumed run needs to continue exactly: the weights,
the optimizer, the step, the settings and the best eval_chat so far (batches are drawn
from (seed, step), so no sampler state is saved). DIR/best.pt: the weights of the best
eval_chat mean acceptance length (ties: row-1 accuracy, then the earlier step), export-able
(export --best); --patience E stops after E evaluations without a new best.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import numpy as np
import torch

from tools.drafter import data
from tools.drafter.commands import BEST, CHECKPOINT, cmd_export, cmd_generate, cmd_merge
from tools.drafter.export import load_drafter
from tools.drafter.losses import mixed_loss, row_target_logp, row_weights
from tools.drafter.model import BlockDrafter, init_weights
from tools.drafter.safetensors_io import read_drafter_file
from tools.drafter.settings import LEGACY_SETTINGS, Settings, better, drafter_config
from tools.drafter.target import Target

# the target's greedy replies to the bench's held-out chats (engine_accuracy.py --sequences)
EVAL_CHAT = Path(__file__).parent / "heldout_greedy.npz"


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
        self.settings = (
            Settings(**{**LEGACY_SETTINGS, **saved["settings"]}) if saved else _settings_from(args)
        )
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
        start = self.warm_start(s) if s.init and not saved else None
        if start is not None:  # the file's vocabulary, and what it covers of this data
            vocab = start.vocab.numpy()
            self.coverage = data.coverage(self.seqs, self.train_idx, vocab)
        vocab_t = saved["drafter"]["vocab"] if saved else torch.from_numpy(vocab)
        cfg = drafter_config(self.target.config, s, len(vocab_t))
        self.drafter = BlockDrafter(cfg, self.target.embedding, vocab_t)
        init_weights(self.drafter, s.seed)
        if start is not None:
            self.drafter.load_state_dict(start.state_dict())
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
        self.step, self.trained_tokens, self.best = 0, 0, None
        if saved:
            self.drafter.load_state_dict(saved["drafter"])
            self.optimizer.load_state_dict(saved["optimizer"])
            self.step, self.trained_tokens = saved["step"], saved["trained_tokens"]
            self.best = saved.get("best")
        self.weights = row_weights(s.block, s.decay_gamma, self.device)
        self._cache: dict[int, dict[int, torch.Tensor]] = {}

    def warm_start(self, s: Settings) -> BlockDrafter:
        """The drafter file `s.init` names, refused unless it was trained for this target
        in the shape these settings give."""
        _, meta = read_drafter_file(s.init)
        if meta.get("target_check") != self.target.check:
            raise SystemExit(f"--init {s.init}: a drafter for another target")
        start = load_drafter(s.init, self.target.embedding)
        want = drafter_config(self.target.config, s, start.cfg.vocab_size)
        if start.cfg != want:
            raise SystemExit(
                f"--init {s.init}: its shape {start.cfg} is not these settings' {want}"
            )
        return start

    def autocast(self):
        return torch.autocast("cuda", torch.bfloat16, enabled=self.device.type == "cuda")

    def batch(
        self, indices: np.ndarray, rng: np.random.Generator, seqs: data.Sequences | None = None
    ) -> tuple[data.Batch, torch.Tensor]:
        s, seqs = self.settings, self.seqs if seqs is None else seqs
        batch = data.make_batch(seqs, indices, self.vocab_index, s.block, s.anchors, s.max_len, rng)
        layers = self.drafter.cfg.target_layers
        if not getattr(self.args, "cache_captures", False):
            return batch, self.target.captures(batch.tokens, layers)
        # small CPU runs: each sequence's rows computed once (the same rows, to rounding)
        cache = self._cache.setdefault(id(seqs), {})
        missing = [n for n, i in enumerate(indices) if int(i) not in cache]
        if missing:
            rows = self.target.captures(batch.tokens[missing], layers)
            for n, r in zip(missing, rows, strict=True):
                i = int(indices[n])
                cache[i] = r[: min(len(seqs.sequence(i)), s.max_len)].clone()
        width = self.drafter.cfg.capture_width
        captures = torch.zeros(*batch.tokens.shape, width, device=self.target.device)
        for n, i in enumerate(indices):
            captures[n, : len(cache[int(i)])] = cache[int(i)]
        return batch, captures

    def target_logp(self, captures: torch.Tensor, batch: data.Batch) -> torch.Tensor:
        """[N, m, B-1, vocab] the target's log-distribution for each row (losses.py)."""
        s = self.settings
        rows = self.target.final_rows(captures)  # what the target's head reads
        return row_target_logp(self.target, rows, batch.anchors, self.drafter.vocab,
                               s.block, s.distill_temperature)  # fmt: skip

    def train_step(self) -> tuple[float, float]:
        s = self.settings
        rng = np.random.default_rng([s.seed, 2, self.step])
        indices = rng.choice(self.train_idx, size=s.batch, replace=len(self.train_idx) < s.batch)
        batch, captures = self.batch(indices, rng)
        dev = self.device
        with self.autocast():
            logits = self.drafter.train_forward(
                captures, batch.tokens.to(dev), batch.anchors.to(dev)
            )
        target_logp = self.target_logp(captures, batch) if s.distill > 0 else None
        loss, hard = mixed_loss(logits, batch.targets.to(dev), self.weights, target_logp, s.distill)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), s.clip)
        for group in self.optimizer.param_groups:
            group["lr"] = s.lr_at(self.step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.trained_tokens += batch.num_tokens
        return loss.item(), hard.item()

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

    def exportable(self) -> dict:
        return {
            "drafter": self.drafter.state_dict(),
            "step": self.step,
            "trained_tokens": self.trained_tokens,
            "settings": asdict(self.settings),
            "target_check": self.target.check,
            "coverage": self.coverage,
        }

    def _write(self, state: dict, name: str) -> None:
        tmp = self.out / (name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.out / name)  # a run killed mid-save keeps the last one

    def save(self) -> None:
        state = {**self.exportable(), "optimizer": self.optimizer.state_dict(), "best": self.best}
        self._write(state, CHECKPOINT)

    def consider(self, evals: dict) -> None:
        """Keep DIR/best.pt at the best eval_chat so far."""
        chat = evals.get("eval_chat")
        if chat is None or not better(chat, self.best):
            return
        self.best = {"step": self.step, "acceptance": chat["acceptance"], "acc": chat["acc"]}
        self._write({**self.exportable(), "eval": chat}, BEST)
        self.log({"event": "best", "step": self.step, "acceptance": chat["acceptance"],
                  "acc1": chat["acc"][0]})  # fmt: skip

    def patience_out(self) -> bool:
        patience, every = getattr(self.args, "patience", 0), self.args.eval_every
        return bool(patience and self.best and self.step - self.best["step"] >= patience * every)

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
        first, losses, stopped = self.step, [], self.patience_out()  # an early stop stays
        while self.step < s.steps and self.step - first < args.run_steps and not stopped:
            if args.minutes and time.time() - started > args.minutes * 60:
                break
            losses.append(self.train_step())
            if self.step % args.log_every == 0:
                rate = (self.step - first) / (time.time() - started)
                loss, hard = np.mean(losses, axis=0)
                self.log({"step": self.step, "loss": round(float(loss), 4),
                          "hard": round(float(hard), 4), "lr": s.lr_at(self.step - 1),
                          "steps_per_s": round(rate, 2)})  # fmt: skip
                losses = []
            if self.step % args.eval_every == 0:
                evals = self.evaluations()
                self.log({"step": self.step, **evals})
                self.consider(evals)
                stopped = self.patience_out()
            if self.step % args.save_every == 0 or stopped:
                self.save()
        evals = self.evaluations()
        self.consider(evals)
        self.save()
        self.log({"event": "early stop" if stopped else "stop", "step": self.step, **evals,
                  "best": self.best, "seconds": round(time.time() - started, 1)})  # fmt: skip


def _settings_from(args: argparse.Namespace) -> Settings:
    return Settings(**{f.name: getattr(args, f.name) for f in fields(Settings)})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("prompts", help="user turns sampled from the target (self_prompts.py)")
    pr.add_argument("--count", type=int, required=True)
    pr.add_argument("--out", type=Path, required=True)
    pr.add_argument("--state", type=Path, default=None, help="chunks (default: OUT.chunks)")
    pr.add_argument("--chunk", type=int, default=1024, help="seeds per chunk")
    pr.add_argument("--batch-size", type=int, default=1024)
    pr.add_argument("--max-turn-tokens", type=int, default=128)
    pr.add_argument("--temperature", type=float, default=1.0)
    pr.add_argument("--top-p", type=float, default=0.95)
    pr.add_argument(
        "--avoid", type=Path, nargs="*", default=[], help="earlier prompt files: no repeats"
    )
    gen = sub.add_parser("generate", help="replies from the target for the prompt set")
    gen.add_argument(
        "--prompts", type=Path, nargs="+", default=[Path(__file__).parent / "prompts.npz"]
    )
    gen.add_argument("--limit", type=int, default=0, help="only the first N prompts (0: all)")
    gen.add_argument("--max-new-tokens", type=int, default=320)
    gen.add_argument("--batch-size", type=int, default=1536)  # H200: 9,500 tok/s (384: 5,100)
    gen.add_argument(
        "--passes", type=int, nargs="+", default=[2], help="replies per prompt (per file)"
    )
    gen.add_argument("--chunk", type=int, default=1536, help="replies per chunk")
    gen.add_argument("--state", type=Path, default=None, help="finished chunks (resumable)")
    gen.add_argument(
        "--greedy-every", type=int, default=4, help="every Nth prompt of pass 0 greedy"
    )
    gen.add_argument("--out", type=Path, required=True)
    for command in (pr, gen):
        command.add_argument("--seed", type=int, default=0)
        command.add_argument("--minutes", type=float, default=0, help="stop after M minutes")
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
    tr.add_argument("--patience", type=int, default=0, help="stop after E evals with no best")
    tr.add_argument("--cache-captures", action="store_true", help="small CPU runs: rows once")
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "distill":  # --distill alone: 1.0
            tr.add_argument(flag, type=float, nargs="?", const=1.0, default=f.default)
            tr.add_argument("--hard-labels", dest="distill", action="store_const", const=0.0)
        else:
            tr.add_argument(flag, type=type(f.default), default=f.default)
    mg = sub.add_parser("merge", help="sequences files in one (a grown data set)")
    mg.add_argument("--data", type=Path, nargs="+", required=True)
    mg.add_argument("--out", type=Path, required=True)
    ex = sub.add_parser("export", help="the safetensors file of DIR's checkpoint")
    ex.add_argument("--out", type=Path, required=True, help="the training DIR")
    ex.add_argument("--file", type=Path, required=True)
    ex.add_argument("--best", action="store_true", help="DIR/best.pt, not the last checkpoint")
    for command in (pr, gen, tr, ex):
        command.add_argument("--model", type=Path, required=True, help="the target GGUF")
        command.add_argument(
            "--device", default=None, help="cuda or cpu (default: cuda if present)"
        )
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    torch.manual_seed(0)
    if args.command == "prompts":
        from tools.drafter.self_prompts import cmd_prompts

        cmd_prompts(args)
    elif args.command == "generate":
        cmd_generate(args)
    elif args.command == "train":
        Trainer(args).run()
    elif args.command == "merge":
        cmd_merge(args)
    else:
        cmd_export(args)


if __name__ == "__main__":
    main()
