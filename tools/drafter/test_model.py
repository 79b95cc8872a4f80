"""The drafter's two forms agree, block by block (run with torch: /tmp/tvenv/bin/python -m
pytest -q tools/drafter). Not in the project's suite: the project's venv has no torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tools.drafter import data
from tools.drafter.model import BlockDrafter, DrafterConfig, init_weights
from tools.drafter.target import unpermute_rows

CFG = DrafterConfig(
    hidden=48, num_layers=2, num_heads=6, num_kv_heads=2, head_dim=8, intermediate=40,
    block=5, rope_base=100000.0, rms_eps=1e-5, vocab_size=30,
)  # fmt: skip
TARGET_VOCAB = 70


def tiny_drafter(seed: int = 0) -> BlockDrafter:
    gen = torch.Generator().manual_seed(seed)
    embedding = torch.randn(TARGET_VOCAB, CFG.hidden, generator=gen, dtype=torch.float64)
    vocab = torch.sort(torch.randperm(TARGET_VOCAB, generator=gen)[: CFG.vocab_size]).values
    drafter = BlockDrafter(CFG, embedding, vocab)
    init_weights(drafter, seed, std=0.2)  # larger than training's: every term matters
    with torch.no_grad():  # norms away from one, so a missed or offset weight shows
        for p in drafter.parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
    return drafter.double()


def test_train_forward_matches_single_blocks():
    drafter = tiny_drafter()
    gen = torch.Generator().manual_seed(1)
    N, T = 3, 23
    captures = torch.randn(N, T, CFG.hidden, generator=gen, dtype=torch.float64) * 5
    tokens = torch.randint(0, TARGET_VOCAB, (N, T), generator=gen)
    anchors = torch.tensor([[1, 7, 8, 20], [0, 3, 12, 21], [5, 5, 16, 22]])
    batched = drafter.train_forward(captures, tokens, anchors)  # [N, m, B-1, vocab]
    for n in range(N):
        for i, a in enumerate(anchors[n].tolist()):
            single = drafter.draft_block(captures[n, :a], int(tokens[n, a]), CFG.block)
            torch.testing.assert_close(batched[n, i], single, rtol=1e-10, atol=1e-10)


def test_a_block_never_sees_context_at_or_after_its_anchor():
    drafter = tiny_drafter()
    gen = torch.Generator().manual_seed(2)
    captures = torch.randn(1, 16, CFG.hidden, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, TARGET_VOCAB, (1, 16), generator=gen)
    anchors = torch.tensor([[6, 10]])
    before = drafter.train_forward(captures, tokens, anchors)
    changed = captures.clone()
    changed[0, 6] += 1.0  # the anchor's own row: only the block at 10 may see it
    after = drafter.train_forward(changed, tokens, anchors)
    torch.testing.assert_close(after[0, 0], before[0, 0], rtol=0, atol=0)
    assert (after[0, 1] - before[0, 1]).abs().max() > 1e-6


def test_a_shorter_block_gives_the_first_rows_of_the_full_one():
    drafter = tiny_drafter()
    captures = torch.randn(
        9, CFG.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    )
    full = drafter.draft_block(captures, 4, CFG.block)
    for rows in range(2, CFG.block):
        short = drafter.draft_block(captures, 4, rows)
        torch.testing.assert_close(short, full[: rows - 1], rtol=1e-12, atol=1e-12)


def test_unpermute_inverts_llama_cpp_permute():
    heads, hd, cols = 3, 8, 5
    w = np.arange(heads * hd * cols, dtype=np.float32).reshape(heads * hd, cols)
    # convert_hf_to_gguf.py's permute
    permuted = w.reshape(heads, 2, hd // 2, cols).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(unpermute_rows(permuted, heads), w)


def test_batches_supervise_each_row_with_the_token_it_predicts():
    seq = np.arange(10, 30, dtype=np.int64)  # 20 tokens, reply from index 8
    seqs = data.Sequences.from_lists([seq], [8], [True], [0])
    vocab = np.arange(10, 30, 2, dtype=np.int32)  # only even ids are draftable
    index = data.vocab_lookup(vocab, 40)
    batch = data.make_batch(seqs, np.array([0]), index, 5, 3, 64, np.random.default_rng(0))
    for k, a in enumerate(batch.anchors[0].tolist()):
        assert 8 <= a < 19
        for j in range(1, 5):
            want = -100 if a + j >= 20 or (seq[a + j] % 2) else int(index[seq[a + j]])
            assert int(batch.targets[0, k, j - 1]) == want


def test_draft_vocabulary_is_the_most_frequent_reply_tokens_sorted():
    seqs = data.Sequences.from_lists(
        [np.array([1, 1, 1, 5, 5, 3, 3, 3, 9, 7])], [2], [False], [0]
    )  # reply: 1 5 5 3 3 3 9 7
    vocab, coverage = data.draft_vocabulary(seqs, np.array([0]), 2)
    np.testing.assert_array_equal(vocab, [3, 5])
    assert coverage == pytest.approx(5 / 8)


def test_the_held_out_slice_holds_whole_prompts():
    """No held-out reply shares its prompt with a trained one (two replies per prompt, as
    generate writes them): the slice scores unseen conversations, not memorised ones."""
    prompt_index = np.concatenate([np.arange(50), np.arange(50)])  # pass 0, then pass 1
    train_idx, held_idx = data.split_heldout(prompt_index, 0.1, 0)
    assert len(held_idx) == 10 and len(train_idx) == 90
    assert not set(prompt_index[held_idx]) & set(prompt_index[train_idx])
    assert sorted([*train_idx, *held_idx]) == list(range(100))
    again = data.split_heldout(prompt_index, 0.1, 0)  # a resumed run splits the same way
    np.testing.assert_array_equal(again[1], held_idx)
