"""The engine's fixture for its NumPy drafter forward: a tiny random drafter file in the
spec's format (the real D = 576, 9/3 heads, head_dim 64, rope base and eps of the target;
1 layer, F = 64, N = 512) and one draft pass's inputs and torch outputs.

    /tmp/tvenv/bin/python -m tools.drafter.make_fixture [--model GGUF] [--out DIR]

E is the real target's table (the engine uses the loaded model's), so only token ids
are stored. The big matrices are stored float16 and the rest float32, so one file tests
both dtypes the format allows (all float32 would be 4.9 MB); the reference is computed
in float64 from the values as stored, then rounded to float32.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from tools.drafter.export import export_drafter, file_tensors, load_drafter
from tools.drafter.model import BlockDrafter, DrafterConfig
from tools.drafter.target import Target

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests/fixtures/block_drafter"
MODEL = Path.home() / ".cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf"
SEED, CONTEXT, BLOCK, SHORT = 20, 37, 16, 5
HALF = ("fc.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")


def random_drafter(target: Target, gen: torch.Generator) -> BlockDrafter:
    c = target.config
    cfg = DrafterConfig(
        hidden=c["hidden_size"], num_layers=1, num_heads=c["num_attention_heads"],
        num_kv_heads=c["num_key_value_heads"], head_dim=c["head_dim"], intermediate=64,
        block=BLOCK, rope_base=c["rope_theta"], rms_eps=c["rms_norm_eps"], vocab_size=512,
    )  # fmt: skip
    vocab = torch.sort(torch.randperm(c["vocab_size"], generator=gen)[: cfg.vocab_size]).values
    drafter = BlockDrafter(cfg, target.embedding, vocab)
    with torch.no_grad():
        for name, p in file_tensors(drafter).items():
            if p.dim() == 2:  # std 1/sqrt(fan_in): activations stay of order one
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            elif name == "mask_embedding":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            else:  # norms away from one: a weight offset by 1 or left out shows
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=gen))
    return drafter


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(SEED)
    target = Target(args.model)
    drafter = random_drafter(target, gen)
    path = args.out / "drafter.safetensors"
    names = file_tensors(drafter)
    export_drafter(
        drafter, path, target_check=target.check, target_vocab=target.config["vocab_size"],
        trained_tokens=0, steps=0, notes=f"random weights, seed {SEED}: a test fixture",
        dtype=np.float16, keep_float32=frozenset(n for n in names if not n.endswith(HALF)),
    )  # fmt: skip
    stored = load_drafter(path, target.embedding).double()
    # capture rows of a real residual stream's scale (norms of several hundred)
    captures = torch.randn(CONTEXT, drafter.cfg.hidden, generator=gen, dtype=torch.float64) * 25
    pending = int(torch.randint(0, target.config["vocab_size"], (1,), generator=gen))
    with torch.no_grad():
        logits = stored.draft_block(captures, pending, BLOCK)  # [B-1, N]
        short = stored.draft_block(captures, pending, SHORT)
        context = stored.context_rows(captures)
    vocab = stored.vocab.numpy().astype(np.int32)
    np.savez(
        args.out / "inputs.npz",
        captures=captures.float().numpy(),
        pending=np.int32(pending),
        block=np.int32(BLOCK),
        logits=logits.float().numpy(),
        short_rows=np.int32(SHORT),
        short_logits=short.float().numpy(),
        context_rows=context.float().numpy(),
        draft_tokens=vocab[logits.argmax(-1).numpy()],
    )
    print(f"{path} ({path.stat().st_size} bytes), inputs.npz: P={CONTEXT}, pending {pending}, "
          f"B={BLOCK}, drafts {vocab[logits.argmax(-1).numpy()].tolist()}")  # fmt: skip


if __name__ == "__main__":
    main()
