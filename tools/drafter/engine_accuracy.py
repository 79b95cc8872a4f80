"""The shipped block drafter's per-row top-1 accuracy through the engine's own runtime,
against the target's greedy continuation, on held-out conversations (project venv).

    python -m tools.drafter.engine_accuracy [--limit 20] [--max-tokens 128] [--rows 4] \
        [--drafter FILE] [--out capture.npz]

Each conversation is one real greedy request (a Session with the block drafter on, so the
rows are the ones the decode loop hands it: the prompt's from prefill, then each plain
step's or verify's kept rows). A recording drafter keeps every row it is given by
position; afterwards a fresh drafter on the same weights replays them and, at every reply
position a (pending token tokens[a], context rows 0..a-1), drafts `rows` tokens with
`block_logits`, the runtime's forward. Row j is scored against tokens[a + j].

--out keeps tokens, rows and some anchors' block logits for the torch-side check
(tools/drafter/test_capture_alignment.py): training's captures of the same tokens must be
these rows, and the torch drafter's logits these logits.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from engine import decoding
from engine import events as ev
from engine.block_drafter import BlockDrafter
from engine.config import EngineConfig
from engine.default_model import default_model_path
from engine.drafter_file import BlockDrafterWeights, target_signature
from engine.drafter_pool import DrafterPool, Member
from engine.loader import load_model
from engine.session import Session

HELDOUT = Path(__file__).resolve().parents[2] / "bench" / "heldout_prompts.json"


class RecordingDrafter(BlockDrafter):
    """The engine's drafter, keeping a copy of every target row it is handed."""

    def __init__(self, weights: BlockDrafterWeights, target: Any) -> None:
        super().__init__(weights, target)
        self.recorded: dict[int, np.ndarray] = {}

    def observe_hidden(self, rows: Any, start: int | None = None) -> None:
        first = self.cursor if start is None else start
        host = np.asarray(self.ops.to_numpy(self.ops.asarray(rows)), dtype=np.float32)
        for i, row in enumerate(host):
            self.recorded[first + i] = row.copy()
        super().observe_hidden(rows, start)


def force_draft_length(k: int) -> None:
    """Draft k tokens every step the room allows, whatever the cost model says: every
    row the drafter is handed then comes from a verify's kept rows (greedy output is the
    same tokens; only the path that captures the rows differs)."""

    def choose(req: Any, costs: Any, produced: int, state: Any, row_limit: int) -> int:
        if req.drafter is None or req.acceptance is None:
            return 0
        room = min(req.max_tokens - produced - 1, row_limit - 1, state.max_verify_rows() - 1)
        return max(0, min(k, room, req.drafter.max_draft))

    decoding._choose_k = choose  # type: ignore[assignment]
    decoding.cut_draft = lambda draft, _costs: draft  # type: ignore[assignment]


def conversations(limit: int) -> list[list[dict[str, str]]]:
    """Held-out single-request chats: open_chat's, then mixed's first turns."""
    held = json.loads(HELDOUT.read_text())
    chats = [chat["messages"] for chat in held["open_chat"]]
    chats += [[{"role": "user", "content": turns[0]}] for turns in held["mixed"]]
    return chats[:limit]


def record(session: Session, messages: list[dict[str, str]], max_tokens: int) -> dict:
    """One greedy request with a fresh recording drafter: its tokens and rows by position."""
    drafter = session.block_drafter
    if not isinstance(drafter, RecordingDrafter):
        raise TypeError("the session needs a RecordingDrafter")
    msgs = tuple(ev.Message(m["role"], m["content"]) for m in messages)
    prompt = list(session.render(msgs, False).token_ids)
    events: list[Any] = []
    settings = ev.GenerationSettings(max_tokens=max_tokens, drafter="block")
    session.generate(ev.Generate("acc", msgs, settings), events.append, lambda: False)
    failed = [e for e in events if isinstance(e, ev.Failed)]
    if failed:
        raise RuntimeError(failed[0].message)
    done = next(e for e in events if isinstance(e, ev.Finished))
    tokens = prompt + list(done.token_ids)
    if done.reason == ev.FinishReason.EOS:  # Finished leaves the EOS out; its row's token
        tokens.append(session.tokenizer.eos_id)
    # every committed position has its row; the last token (pending or EOS) has none
    have = sorted(drafter.recorded)
    if have != list(range(len(tokens) - 1)):
        raise RuntimeError(f"rows for positions {have[:3]}..{have[-3:]}, {len(tokens)} tokens")
    rows = np.stack([drafter.recorded[t] for t in have])
    return {
        "tokens": np.asarray(tokens, dtype=np.int64),
        "reply_start": len(prompt),
        "rows": rows,
        "drafted": done.stats.drafted if done.stats else 0,
        "accepted": done.stats.accepted if done.stats else 0,
    }


def replay(weights: BlockDrafterWeights, target: Any, seq: dict, num_rows: int) -> np.ndarray:
    """Draft-vocabulary logits [A, num_rows, N] at every reply anchor a (A of them), through
    the runtime's path: begin, the prompt's rows, then per token block_logits, its row, commit."""
    tokens, start, rows = seq["tokens"], seq["reply_start"], seq["rows"]
    drafter = BlockDrafter(weights, target)
    drafter.begin([int(t) for t in tokens[:start]])
    drafter.observe_hidden(rows[:start], 0)
    out = []
    for a in range(start, len(tokens) - 1):
        logits = drafter.block_logits(int(tokens[a]), num_rows)
        out.append(np.asarray(drafter.ops.to_numpy(logits), dtype=np.float32))
        drafter.observe_hidden(rows[a : a + 1])
        drafter.commit([int(tokens[a])])
    return np.stack(out) if out else np.zeros((0, num_rows, len(weights.vocab)), np.float32)


def row_hits(vocab: np.ndarray, seq: dict, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(correct, present) [A, rows] bool: row j of anchor a against tokens[a + j], and
    whether the reply reaches that token at all."""
    tokens, start = seq["tokens"], seq["reply_start"]
    drafts = vocab[logits.argmax(-1)]  # [A, rows]
    anchors = np.arange(start, len(tokens) - 1)[:, None]
    at = anchors + np.arange(1, logits.shape[1] + 1)[None, :]
    present = at < len(tokens)
    truth = np.asarray(tokens)[np.minimum(at, len(tokens) - 1)]
    return (drafts == truth) & present, present


def score(vocab: np.ndarray, seq: dict, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hits, counted) per row: row j of anchor a against tokens[a + j]."""
    correct, present = row_hits(vocab, seq, logits)
    return correct.sum(axis=0).astype(float), present.sum(axis=0).astype(float)


def save_sequences(path: Path, seqs: list[np.ndarray], reply_start: list[int]) -> None:
    """The replies as tools/drafter/data.py's sequences file (written without torch)."""
    lengths = np.array([len(t) for t in seqs], dtype=np.int64)
    np.savez_compressed(
        path,
        tokens=np.concatenate(seqs).astype(np.uint16),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        reply_start=np.array(reply_start, dtype=np.int32),
        sampled=np.zeros(len(seqs), dtype=bool),  # greedy
        prompt_index=np.arange(len(seqs), dtype=np.int32),
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=20, help="held-out conversations")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rows", type=int, default=4, help="block rows scored (1..rows)")
    p.add_argument("--drafter", type=Path, default=None, help="default: the shipped file")
    p.add_argument("--backend", default=None, help="numpy or mlx (default: the engine's)")
    p.add_argument("--cpu-matmul", default=None, help="int8 or float (EngineConfig.cpu_matmul)")
    p.add_argument("--kv-dtype", default=None, help="float16 or float32 (EngineConfig.kv_dtype)")
    p.add_argument("--force-k", type=int, default=0, help="draft k every step (0: the cost model)")
    p.add_argument("--sequences", type=Path, default=None, help="a sequences file (data.py)")
    p.add_argument("--out", type=Path, default=None, help="tokens, rows, logits for torch")
    args = p.parse_args(argv)
    config = EngineConfig(backend=args.backend, cpu_matmul=args.cpu_matmul, kv_dtype=args.kv_dtype)
    if args.force_k:
        force_draft_length(args.force_k)
    loaded = load_model(default_model_path(), config)
    first = Session(loaded, config=config)
    if first.block_drafter is None and args.drafter is None:
        raise SystemExit(first.block_problem)
    path = args.drafter or first.block_drafter.w.path  # type: ignore[union-attr]
    signature = target_signature(loaded.config, loaded.tokenizer)
    weights = BlockDrafterWeights(path, loaded.model, signature)
    vocab = weights.vocab
    hits, counted = np.zeros(args.rows), np.zeros(args.rows)
    in_vocab = [0, 0]
    saved: dict[str, Any] = {}
    drafted = accepted = 0
    chats, starts = conversations(args.limit), []
    for n, messages in enumerate(chats):
        session = Session(loaded, config=config)  # a fresh one each, as bench speculative's
        session.block_drafter = RecordingDrafter(weights, loaded.model)
        # the block drafter alone: lookup's drafts would hand it no other rows, but would
        # muddle the live acceptance this prints
        own = Member("block", session.block_drafter, session.acceptance[ev.DrafterKind.BLOCK])
        session.block_pool = DrafterPool([own])
        seq = record(session, messages, args.max_tokens)
        logits = replay(weights, loaded.model, seq, args.rows)
        h, c = score(vocab, seq, logits)
        hits, counted = hits + h, counted + c
        reply = seq["tokens"][seq["reply_start"] + 1 :]
        in_vocab[0] += int(np.isin(reply, vocab).sum())
        in_vocab[1] += len(reply)
        drafted, accepted = drafted + seq["drafted"], accepted + seq["accepted"]
        live = f"{seq['accepted']}/{seq['drafted']}"
        print(f"{n + 1:2d}: {len(seq['tokens'])} tokens ({seq['reply_start']} prompt), "
              f"row 1 {h[0]:.0f}/{c[0]:.0f}, live drafts {live}")  # fmt: skip
        saved[f"tokens_{n}"] = seq["tokens"]
        saved[f"reply_start_{n}"] = np.int64(seq["reply_start"])
        starts.append(seq["reply_start"])
        saved[f"rows_{n}"] = seq["rows"]
        saved[f"logits_{n}"] = logits
    acc = hits / np.maximum(counted, 1)
    result = {
        "conversations": args.limit,
        "max_tokens": args.max_tokens,
        "backend": loaded.ops.name,
        "drafter": Path(path).name,
        "anchors": int(counted[0]),
        "top1_by_row": [round(float(a), 4) for a in acc],
        "reply_tokens_in_draft_vocab": round(in_vocab[0] / max(in_vocab[1], 1), 4),
        "live_accepted_of_drafted": [accepted, drafted],
    }
    print(json.dumps(result))
    if args.sequences is not None:
        save_sequences(args.sequences, [saved[f"tokens_{n}"] for n in range(len(chats))], starts)
    if args.out is not None:
        np.savez_compressed(args.out, count=np.int64(len(chats)), **saved)


if __name__ == "__main__":
    main()
