"""The training replies, sampled from the target itself (so the drafter learns the
target's own distribution): transformers' generate over batches of left-padded prompts
with a KV cache, greedy for every `greedy_every`-th prompt of the first pass and sampled
(temperature cycling over TEMPERATURES, top-p) otherwise; each reply ends at the
target's EOS (kept: the drafter learns to propose the end too) or at max_new_tokens.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from tools.drafter.data import Sequences
from tools.drafter.target import Target

TEMPERATURES = (0.7, 0.85, 1.0)
TOP_P = 0.95


def _plan(num_prompts: int, passes: int, greedy_every: int) -> list[tuple[int, float]]:
    """(prompt, temperature; 0 = greedy) for every reply to generate."""
    plan = []
    for p in range(passes):
        for i in range(num_prompts):
            greedy = p == 0 and greedy_every > 0 and i % greedy_every == 0
            plan.append((i, 0.0 if greedy else TEMPERATURES[(i + p) % len(TEMPERATURES)]))
    return plan


def generate_replies(
    target: Target,
    prompts: list[np.ndarray],
    *,
    max_new_tokens: int,
    batch_size: int,
    passes: int,
    greedy_every: int,
    seed: int,
    log=print,
) -> Sequences:
    plan = _plan(len(prompts), passes, greedy_every)
    seqs, starts, sampled, prompt_ids = [], [], [], []
    started, new_tokens, batch_seed = time.time(), 0, seed
    for temperature in sorted({t for _, t in plan}):
        # one setting per batch; within it, similar lengths together (less padding)
        group = sorted((i for i, t in plan if t == temperature), key=lambda i: (len(prompts[i]), i))
        for b0 in range(0, len(group), batch_size):
            chunk = group[b0 : b0 + batch_size]
            batch_seed += 1
            replies = _generate_batch(
                target, [prompts[i] for i in chunk], temperature, max_new_tokens, batch_seed
            )
            for i, reply in zip(chunk, replies, strict=True):
                seqs.append(np.concatenate([prompts[i], reply]))
                starts.append(len(prompts[i]))
                sampled.append(temperature > 0)
                prompt_ids.append(i)
                new_tokens += len(reply)
            spent = time.time() - started
            log(f"generate: {len(seqs)}/{len(plan)} replies, {new_tokens} tokens, {spent:.0f} s")
    return Sequences.from_lists(seqs, starts, sampled, prompt_ids)


@torch.no_grad()
def _generate_batch(
    target: Target, prompts: list[np.ndarray], temperature: float, max_new: int, seed: int
) -> list[np.ndarray]:
    """Each prompt's reply tokens, up to and including the first EOS."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), target.eos_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for n, p in enumerate(prompts):  # left padding: every prompt ends where generation starts
        ids[n, width - len(p) :] = torch.from_numpy(p)
        mask[n, width - len(p) :] = 1
    torch.manual_seed(seed)
    options = {"do_sample": False}
    if temperature > 0:
        options = {"do_sample": True, "temperature": temperature, "top_p": TOP_P, "top_k": 0}
    out = (
        target.model.generate(
            input_ids=ids.to(target.device),
            attention_mask=mask.to(target.device),
            max_new_tokens=max_new,
            eos_token_id=target.eos_id,
            pad_token_id=target.eos_id,
            **options,
        )[:, width:]
        .cpu()
        .numpy()
    )
    replies = []
    for row in out:
        ends = np.flatnonzero(row == target.eos_id)
        replies.append(row[: ends[0] + 1] if len(ends) else row)
    return replies
