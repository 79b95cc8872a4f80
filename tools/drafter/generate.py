"""The training replies, sampled from the target itself (so the drafter learns the
target's own distribution): transformers' generate over batches of left-padded prompts
with a KV cache, greedy for every `greedy_every`-th prompt of the first pass and sampled
(temperature cycling over TEMPERATURES, top-p) otherwise; each reply ends at the
target's EOS (kept: the drafter learns to propose the end too) or at max_new_tokens.

Chunked and resumable: the plan (prompt, temperature) is cut into chunks of `chunk`
replies of one temperature, and with a `state` folder each finished chunk is written
there at once (chunk_NNNNN.npz, a sequences file; written to a temporary name and
renamed, so a killed call loses at most the chunk it was generating). A later call with
the same prompts and settings skips the chunks on disk; `plan.json` refuses a state
folder made with other ones. Batch seeds are a function of (seed, chunk, batch).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from tools.drafter.data import Sequences, concatenate
from tools.drafter.target import Target

TEMPERATURES = (0.7, 0.85, 1.0)
TOP_P = 0.95


def _plan(num_prompts: int, passes: int | list[int], greedy_every: int) -> list[tuple[int, float]]:
    """(prompt, temperature; 0 = greedy) for every reply to generate. `passes` is one
    count for every prompt or one per prompt."""
    per_prompt = [passes] * num_prompts if isinstance(passes, int) else list(passes)
    plan = []
    for p in range(max(per_prompt, default=0)):
        for i in range(num_prompts):
            if p >= per_prompt[i]:
                continue
            greedy = p == 0 and greedy_every > 0 and i % greedy_every == 0
            plan.append((i, 0.0 if greedy else TEMPERATURES[(i + p) % len(TEMPERATURES)]))
    return plan


def chunk_plan(
    prompts: list[np.ndarray], plan: list[tuple[int, float]], chunk: int
) -> list[tuple[float, list[int]]]:
    """(temperature, prompt indices) per chunk: one setting per chunk, similar prompt
    lengths together (less padding), every plan entry in exactly one chunk."""
    chunks = []
    for temperature in sorted({t for _, t in plan}):
        group = sorted((i for i, t in plan if t == temperature), key=lambda i: (len(prompts[i]), i))
        chunks += [(temperature, group[c : c + chunk]) for c in range(0, len(group), chunk)]
    return chunks


def _fingerprint(prompts: list[np.ndarray], settings: dict) -> dict:
    digest = hashlib.sha256()
    for p in prompts:
        digest.update(np.asarray(p, dtype=np.int64).tobytes() + b"|")
    return {**settings, "prompts_sha256": digest.hexdigest(), "num_prompts": len(prompts)}


def check_state(state: Path, expected: dict) -> None:
    """Write state/plan.json on first use; refuse a state folder made for another plan."""
    state.mkdir(parents=True, exist_ok=True)
    path = state / "plan.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved != expected:
            diff = sorted(
                k for k in expected.keys() | saved.keys() if saved.get(k) != expected.get(k)
            )
            raise ValueError(
                f"{state} holds a generation with other settings ({diff}); use a new folder"
            )
    else:
        path.write_text(json.dumps(expected, indent=1, sort_keys=True))


def save_atomic(seqs: Sequences, path: Path) -> None:
    tmp = path.with_name(path.stem + ".tmp.npz")
    seqs.save(tmp)
    os.replace(tmp, path)  # a kill mid-write leaves no chunk file


def generate_replies(
    target: Target,
    prompts: list[np.ndarray],
    *,
    max_new_tokens: int,
    batch_size: int,
    passes: int | list[int],
    greedy_every: int,
    seed: int,
    chunk: int = 1536,
    state: Path | None = None,
    deadline: float | None = None,
    log=print,
) -> Sequences | None:
    """Every planned reply, or None when `deadline` (time.time()) comes before the next
    chunk could end (judged by the last chunk's time); the chunks done so far are then in
    `state` for the next call."""
    plan = _plan(len(prompts), passes, greedy_every)
    chunks = chunk_plan(prompts, plan, chunk)
    if state is not None:
        settings = {"max_new_tokens": max_new_tokens, "passes": passes, "chunk": chunk,
                    "greedy_every": greedy_every, "seed": seed, "top_p": TOP_P}  # fmt: skip
        check_state(Path(state), _fingerprint(prompts, settings))
    parts, started, new_tokens, done, last = [], time.time(), 0, 0, 0.0
    for c, (temperature, members) in enumerate(chunks):
        path = None if state is None else Path(state) / f"chunk_{c:05d}.npz"
        if path is not None and path.exists():
            part = Sequences.load(path)
            if list(part.prompt_index) != members:
                raise ValueError(f"{path} does not hold the replies this plan puts there")
        else:
            if deadline is not None and time.time() + last > deadline:
                log(f"generate: stopped for the deadline, {c}/{len(chunks)} chunks done")
                return None
            t0 = time.time()
            part = _generate_chunk(target, prompts, members, temperature, max_new_tokens,
                                   batch_size, seed, c)  # fmt: skip
            last = time.time() - t0
            if path is not None:
                save_atomic(part, path)
            new_tokens += int((part.lengths() - part.reply_start).sum())
        parts.append(part)
        done += len(part)
        log(f"generate: chunk {c + 1}/{len(chunks)}, {done}/{len(plan)} replies, "
            f"{new_tokens} new tokens, {time.time() - started:.0f} s")  # fmt: skip
    return concatenate(parts)


def _generate_chunk(target, prompts, members, temperature, max_new, batch_size, seed, c):
    seqs, starts = [], []
    for b0 in range(0, len(members), batch_size):
        batch = members[b0 : b0 + batch_size]
        batch_seed = int(np.random.default_rng([seed, 5, c, b0]).integers(1 << 62))
        replies = _generate_batch(
            target, [prompts[i] for i in batch], temperature, max_new, batch_seed
        )
        for i, reply in zip(batch, replies, strict=True):
            seqs.append(np.concatenate([prompts[i], reply]))
            starts.append(len(prompts[i]))
    return Sequences.from_lists(seqs, starts, [temperature > 0] * len(seqs), list(members))


@torch.no_grad()
def _generate_batch(
    target: Target,
    prompts: list[np.ndarray],
    temperature: float,
    max_new: int,
    seed: int,
    stop_ids: list[int] | None = None,
    top_p: float = TOP_P,
) -> list[np.ndarray]:
    """Each prompt's continuation, up to and including the first stop id (default: EOS)."""
    stop = [target.eos_id] if stop_ids is None else list(stop_ids)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), target.eos_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for n, p in enumerate(prompts):  # left padding: every prompt ends where generation starts
        ids[n, width - len(p) :] = torch.from_numpy(np.asarray(p, dtype=np.int64))
        mask[n, width - len(p) :] = 1
    torch.manual_seed(seed)
    options = {"do_sample": False}
    if temperature > 0:
        options = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    out = (
        target.model.generate(
            input_ids=ids.to(target.device),
            attention_mask=mask.to(target.device),
            max_new_tokens=max_new,
            eos_token_id=stop if len(stop) > 1 else stop[0],
            pad_token_id=target.eos_id,
            **options,
        )[:, width:]
        .cpu()
        .numpy()
    )
    replies = []
    for row in out:
        ends = np.flatnonzero(np.isin(row, stop))
        replies.append(row[: ends[0] + 1] if len(ends) else row)
    return replies
