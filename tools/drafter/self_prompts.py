"""Training prompts the target writes itself: user turns sampled from the target.

The chat template is rendered up to the start of a user turn (a seed of prompt_seeds.py
may put a system message, an earlier exchange or the turn's first words before that
point), the target samples at temperature ~1 with top-p until its end-of-turn token, and
the decoded turn becomes a training conversation, rendered as prompts.py renders one.
A turn is dropped when it is empty, runs past `max_turn_tokens` without ending, ends on
another stop token, holds a special token, bad UTF-8, a duplicate (case and spacing
ignored) or one of bench/heldout_prompts.json's user turns (prompts.check_disjoint).

Chunked: `chunk` seeds per chunk, each finished chunk written to STATE/chunk_NNNNN.json
at once (temporary name, then renamed): a killed call loses at most its current chunk,
and a later call loads the chunks on disk and goes on (duplicates are checked against
them too). The output is a prompts file (prompts.npz's tokens/offsets/domain/domain_names,
plus each conversation's messages as JSON), read by `generate` as prompts.npz is.

Needs the engine's tokenizer and chat template (`tokenizers`, `jinja2`: both come with
transformers and torch, so the H200 has them) and the GGUF's metadata via gguf_target.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tools.drafter import prompt_seeds
from tools.drafter.prompts import check_disjoint, load_heldout, render_ids, token_dtype

SENTINEL = "\x00TURN\x00"
KINDS = sorted(prompt_seeds.SHARES)


def load_tokenizer(gguf_path: str | Path):
    """The engine's tokenizer from the GGUF's metadata, read with NumPy alone."""
    from engine.tokenizer import Tokenizer
    from tools.drafter.gguf_target import GGUFFile

    gguf = GGUFFile(gguf_path)
    return Tokenizer.from_gguf_metadata(gguf.meta, gguf.path)


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def heldout_turns() -> set[str]:
    """The held-out chats' user turns, normalised."""
    return {normalise(m["content"]) for chat in load_heldout() for m in chat if m["role"] == "user"}


def sampling_prefix(tokenizer, seed: prompt_seeds.Seed) -> list[int]:
    """Token ids of the template rendered up to the sampled turn's first token: the seed's
    messages (its steer as the system message), the user turn's header, its opener."""
    from engine.chat_template import render_chat

    messages = list(seed.context)
    if seed.steer is not None and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": seed.steer})
    text = render_chat(
        tokenizer.chat_template,
        [*messages, {"role": "user", "content": SENTINEL}],
        add_generation_prompt=False,
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
    )
    if text.count(SENTINEL) != 1:
        raise ValueError("the chat template does not render a user turn's content once")
    return tokenizer.encode(
        text[: text.index(SENTINEL)] + seed.opener, add_special=tokenizer.add_bos
    )


@dataclass
class Filter:
    """What a sampled turn must pass; `seen` grows with every accepted turn."""

    tokenizer: object
    end_id: int
    max_turn_tokens: int
    held: set[str]  # heldout_turns()
    seen: set[str] = field(default_factory=set)

    def why_dropped(self, seed: prompt_seeds.Seed, turn_ids: list[int]) -> str | tuple[str, list]:
        """A reason, or ("ok", messages) for an accepted turn."""
        tok = self.tokenizer
        if not turn_ids or turn_ids[-1] != self.end_id:
            stopped = turn_ids and turn_ids[-1] in tok.eos_ids
            return "other stop token" if stopped else "over-long"
        if len(turn_ids) > self.max_turn_tokens:
            return "over-long"
        body = turn_ids[:-1]
        if any(tok.is_special(t) for t in body):
            return "special token"
        text = (seed.opener + tok.decode(body)).strip()
        if "\ufffd" in text:
            return "bad utf-8"
        if len(normalise(text)) < 3 or normalise(text) == normalise(seed.opener):
            return "empty"
        messages = [*seed.context, {"role": "user", "content": text}]
        if normalise(text) in self.held:
            return "held-out"
        try:
            check_disjoint([("self", messages)])
        except ValueError:
            return "held-out"
        if normalise(text) in self.seen:
            return "duplicate"
        self.seen.add(normalise(text))
        return "ok", messages


def _write_json_atomic(path: Path, records: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(records, ensure_ascii=False))
    os.replace(tmp, path)


def sample_chunk(target, tokenizer, flt: Filter, k: int, *, chunk: int, batch_size: int,
                 temperature: float, top_p: float, seed: int, log=print) -> list[dict]:  # fmt: skip
    """Chunk k's accepted conversations, in seed order (a function of seed, k and `flt`)."""
    from tools.drafter.generate import _generate_batch

    rng = random.Random(f"{seed}-{k}")
    seeds = [prompt_seeds.draw_seed(rng) for _ in range(chunk)]
    prefixes = [sampling_prefix(tokenizer, s) for s in seeds]
    order = sorted(range(chunk), key=lambda i: (len(prefixes[i]), i))  # less padding
    turns: dict[int, list[int]] = {}
    for b0 in range(0, chunk, batch_size):
        batch = order[b0 : b0 + batch_size]
        batch_seed = int(np.random.default_rng([seed, 6, k, b0]).integers(1 << 62))
        batch_prefixes = [np.array(prefixes[i]) for i in batch]
        stops = sorted(tokenizer.eos_ids)
        out = _generate_batch(
            target, batch_prefixes, temperature, flt.max_turn_tokens, batch_seed, stops, top_p
        )
        turns.update({i: [int(t) for t in row] for i, row in zip(batch, out, strict=True)})
    records, reasons = [], {}
    for i, s in enumerate(seeds):
        verdict = flt.why_dropped(s, turns[i])
        if isinstance(verdict, str):
            reasons[verdict] = reasons.get(verdict, 0) + 1
            continue
        messages = verdict[1]
        ids = render_ids(tokenizer, messages)
        records.append(
            {"kind": s.kind, "messages": messages, "opener": s.opener, "turn_ids": turns[i],
             "ids": ids}
        )  # fmt: skip
    log(f"prompts: chunk {k}: {len(records)}/{chunk} kept, dropped {reasons}")
    return records


def sample_prompts(target, tokenizer, count: int, state: Path, *, chunk: int = 1024,
                   batch_size: int = 1024, max_turn_tokens: int = 128, temperature: float = 1.0,
                   top_p: float = 0.95, seed: int = 0, deadline: float | None = None,
                   avoid: frozenset[str] = frozenset(),
                   log=print) -> list[dict] | None:  # fmt: skip
    """`count` conversations (chunks on disk first), or None when `deadline` comes before
    the next chunk could end (judged by the last chunk's time). A turn equal to one in
    `avoid` (normalised: an earlier set's, `avoided_turns`) is dropped as a duplicate."""
    state = Path(state)
    state.mkdir(parents=True, exist_ok=True)
    settings = {
        "chunk": chunk,
        "max_turn_tokens": max_turn_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "target_check": getattr(target, "check", None),
        "avoid": hashlib.sha256("\n".join(sorted(avoid)).encode()).hexdigest() if avoid else "",
    }
    manifest = state / "settings.json"
    if manifest.exists() and json.loads(manifest.read_text()) != settings:
        raise ValueError(f"{state} holds prompts sampled with other settings; use a new folder")
    manifest.write_text(json.dumps(settings, indent=1, sort_keys=True))
    end_id = tokenizer.token_to_id("<|im_end|>")
    end_id = tokenizer.eos_id if end_id is None else end_id
    flt = Filter(tokenizer, end_id, max_turn_tokens, heldout_turns(), seen=set(avoid))
    records: list[dict] = []
    k, last = 0, 0.0
    while True:
        path = state / f"chunk_{k:05d}.json"
        if path.exists():
            done = json.loads(path.read_text())
            for r in done:  # as if accepted now: later chunks see them as duplicates
                flt.seen.add(normalise(r["messages"][-1]["content"]))
            records += done
        elif len(records) >= count:
            break
        elif deadline is not None and time.time() + last > deadline:
            log(f"prompts: stopped for the deadline with {len(records)}/{count}")
            return None
        else:
            options = {"temperature": temperature, "top_p": top_p, "seed": seed, "log": log}
            t0 = time.time()
            new = sample_chunk(
                target, tokenizer, flt, k, chunk=chunk, batch_size=batch_size, **options
            )
            last = time.time() - t0
            if not new:  # every turn dropped: more chunks would not help
                raise RuntimeError(f"chunk {k} kept no prompt of {chunk}; see the reasons above")
            log(f"prompts: {len(records) + len(new)}/{count} after chunk {k}, {last:.0f} s")
            _write_json_atomic(path, new)
            records += new
        k += 1
    return records[:count]


def avoided_turns(paths: list[Path]) -> frozenset[str]:
    """The sampled user turns of earlier prompt files (save_prompts'), normalised."""
    turns = set()
    for path in paths:
        with np.load(path) as f:
            turns |= {normalise(json.loads(m)[-1]["content"]) for m in f["messages"]}
    return frozenset(turns)


def save_prompts(records: list[dict], path: Path, vocab_size: int) -> None:
    """A prompts file as prompts.py writes one, plus the messages (JSON, one a prompt)."""
    check_disjoint([("self", r["messages"]) for r in records])
    ids = [r["ids"] for r in records]
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    tmp = Path(path).with_name(Path(path).stem + ".tmp.npz")
    np.savez_compressed(
        tmp,
        tokens=np.concatenate(ids).astype(token_dtype(vocab_size)),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        domain=np.array([KINDS.index(r["kind"]) for r in records], dtype=np.uint8),
        domain_names=np.array(KINDS),
        messages=np.array([json.dumps(r["messages"], ensure_ascii=False) for r in records]),
    )
    os.replace(tmp, path)


def cmd_prompts(args) -> None:
    """`train prompts`: sample until --count conversations, then write --out."""
    import torch

    from tools.drafter.target import Target

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    started = time.time()
    target = Target(args.model, device)
    tokenizer = load_tokenizer(args.model)
    state = args.state or Path(str(args.out) + ".chunks")
    deadline = started + args.minutes * 60 if args.minutes else None
    records = sample_prompts(target, tokenizer, args.count, state, chunk=args.chunk,
                             batch_size=args.batch_size, max_turn_tokens=args.max_turn_tokens,
                             temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                             deadline=deadline, avoid=avoided_turns(args.avoid))  # fmt: skip
    if records is None:
        print(f"prompts: incomplete after {time.time() - started:.0f} s; run again to go on")
        return
    if len(records) < args.count:
        raise SystemExit(f"only {len(records)} prompts")
    save_prompts(records, args.out, tokenizer.vocab_size)
    lengths = [len(r["ids"]) for r in records]
    kinds = {k: sum(r["kind"] == k for r in records) for k in KINDS}
    print(f"{len(records)} prompts, {sum(lengths)} tokens (mean {np.mean(lengths):.0f}), "
          f"{kinds}, {time.time() - started:.0f} s -> {args.out}")  # fmt: skip
