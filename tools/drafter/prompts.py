"""The drafter's training prompts: ~3,000 conversations built deterministically from
prompt_pools.py, rendered with the target's own chat template and tokenizer (as
engine/session.py renders a chat) to prompt token ids, saved compact for the GPU machine.

    python -m tools.drafter.prompts [--model GGUF] [--out tools/drafter/prompts.npz]

Runs in the project's venv (it needs the engine's tokenizer); the GPU machine only reads
the file. The held-out prompts (bench/heldout_prompts.json) are written by hand, not built here, and
a check below refuses a training prompt that repeats one of them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

from tools.drafter import prompt_pools as pools

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "prompts.npz"
HELDOUT = HERE.parents[1] / "bench" / "heldout_prompts.json"  # the bench's held-out set
# conversations per domain: ~3,000 in all
QUOTAS = {"question": 900, "code": 700, "explain": 700, "writing": 250, "multi_turn": 450}
SYSTEM_SHARE = 0.15  # of conversations that open with a custom system message


def _questions(rng: random.Random) -> list[str]:
    return [s.format(t=t) for t in pools.TOPICS for s in pools.QUESTION_STYLES]


def _code(rng: random.Random) -> list[str]:
    asks = [
        tmpl.format(lang=lang, task=task)
        for task in pools.CODE_TASKS
        for lang in pools.LANGUAGES
        for tmpl in pools.CODE_TEMPLATES
    ]
    snippets = [
        f"{q}\n\n```{lang}\n{code}\n```"
        for lang, code in pools.CODE_SNIPPETS
        for q in pools.SNIPPET_QUESTIONS
    ]
    return asks + snippets * 4  # the snippets are few: weight them up against the asks


def _explain(rng: random.Random) -> list[str]:
    compare = [t.format(a=a, b=b) for a, b in pools.COMPARE_PAIRS for t in pools.COMPARE_TEMPLATES]
    howto = [t.format(h=h) for h in pools.HOWTO for t in pools.HOWTO_TEMPLATES]
    lists = [
        t.format(n=rng.choice([3, 5, 7, 10]), x=x)
        for x in pools.LIST_REQUESTS
        for t in pools.LIST_TEMPLATES
    ]
    summaries = [t.format(p=p) for p in pools.PASSAGES for t in pools.PASSAGE_TEMPLATES] * 3
    return compare + howto + lists + summaries


def _writing(rng: random.Random) -> list[str]:
    return [t.format(w=w) for w in pools.WRITING_TASKS for t in pools.WRITING_TEMPLATES]


def _multi_turn(rng: random.Random, count: int) -> list[list[dict]]:
    """Two- and three-turn chats: earlier assistant turns are the written answers."""
    chats = []
    for i in range(count):
        first, second = rng.sample(pools.EXCHANGES, 2)
        turns = [{"role": "user", "content": first[0]}, {"role": "assistant", "content": first[1]}]
        if i % 3 == 2:  # a change of subject, then a follow-up on the new one
            turns += [
                {"role": "user", "content": second[0]},
                {"role": "assistant", "content": second[1]},
            ]
        turns.append({"role": "user", "content": rng.choice(pools.FOLLOW_UPS)})
        chats.append(turns)
    return chats


def build_conversations(seed: int = 20) -> list[tuple[str, list[dict]]]:
    """(domain, messages) for every training conversation, the same list for one seed."""
    rng = random.Random(seed)
    singles = {
        "question": _questions(rng),
        "code": _code(rng),
        "explain": _explain(rng),
        "writing": _writing(rng),
    }
    conversations: list[tuple[str, list[dict]]] = []
    for domain, pool in singles.items():
        quota = QUOTAS[domain]
        picks = (
            rng.sample(pool, quota)
            if len(pool) >= quota
            else [rng.choice(pool) for _ in range(quota)]
        )
        conversations += [(domain, [{"role": "user", "content": text}]) for text in picks]
    conversations += [("multi_turn", chat) for chat in _multi_turn(rng, QUOTAS["multi_turn"])]
    for _, messages in conversations:
        if rng.random() < SYSTEM_SHARE:
            messages.insert(0, {"role": "system", "content": rng.choice(pools.SYSTEM_PROMPTS)})
    rng.shuffle(conversations)
    return conversations


def load_heldout() -> list[list[dict]]:
    """The held-out conversations of bench/heldout_prompts.json: its open-chat ones
    ({"name", "messages"}) and its mixed ones (user turns), as message lists."""
    held = json.loads(HELDOUT.read_text(encoding="utf-8"))
    chats = [item["messages"] for item in held["open_chat"]]
    return chats + [
        [{"role": "user", "content": turn} for turn in turns] for turns in held["mixed"]
    ]


def check_disjoint(conversations: list[tuple[str, list[dict]]]) -> None:
    """No held-out user turn appears in a training conversation."""
    held = {m["content"] for chat in load_heldout() for m in chat if m["role"] == "user"}
    for _, messages in conversations:
        for m in messages:
            if m["content"] in held:
                raise ValueError(f"a held-out prompt is in the training set: {m['content']!r}")


def token_dtype(vocab_size: int) -> type:
    """The narrowest unsigned type for ids below vocab_size: uint16 keeps the files small."""
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def render_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Prompt token ids as engine/session.py renders a chat: the template with the
    generation prompt, then the tokenizer's BOS rule."""
    from engine.chat_template import render_chat

    text = render_chat(
        tokenizer.chat_template,
        messages,
        add_generation_prompt=True,
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
    )
    return tokenizer.encode(text, add_special=tokenizer.add_bos)


def main(argv: list[str] | None = None) -> None:
    from engine.default_model import default_model_path
    from engine.gguf_file import read_gguf_file
    from engine.tokenizer import Tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="the target GGUF (default model)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args(argv)
    path = args.model or default_model_path()
    meta, _ = read_gguf_file(path)
    tokenizer = Tokenizer.from_gguf_metadata(meta, path)
    conversations = build_conversations(args.seed)
    check_disjoint(conversations)
    ids = [render_ids(tokenizer, messages) for _, messages in conversations]
    domains = sorted(QUOTAS)
    lengths = np.array([len(x) for x in ids])
    np.savez_compressed(
        args.out,
        tokens=np.concatenate(ids).astype(token_dtype(tokenizer.vocab_size)),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        domain=np.array([domains.index(d) for d, _ in conversations], dtype=np.uint8),
        domain_names=np.array(domains),
    )
    heldout_ids = [render_ids(tokenizer, chat) for chat in load_heldout()]
    print(
        f"{len(ids)} conversations, {lengths.sum()} prompt tokens (mean {lengths.mean():.0f}, "
        f"max {lengths.max()}); {len(heldout_ids)} held-out prompts, "
        f"{sum(map(len, heldout_ids))} tokens -> {args.out} ({args.out.stat().st_size} bytes)"
    )


if __name__ == "__main__":
    main()
