"""tools/drafter/tree_policy.py: the tree a drafter's rows make, and what it accepts."""

from __future__ import annotations

import numpy as np

from tools.drafter.tree_policy import NOT_IN_TOP, TOP, accepted, best_tree, row_ranks


def _rows(*tops: list[float]) -> np.ndarray:
    """[R, TOP] probabilities, each row's best first."""
    return np.array([top + [0.0] * (TOP - len(top)) for top in tops])


def test_the_tree_takes_the_likeliest_paths_first():
    probs = _rows([0.6, 0.3, 0.1], [0.9, 0.1], [0.5, 0.5])
    # 0.6, then 0.6 * 0.9 = 0.54, then 0.3, then 0.6 * 0.9 * 0.5 twice
    assert best_tree(probs, 3) == {(0,), (0, 0), (1,)}
    assert best_tree(probs, 5) == {(0,), (0, 0), (1,), (0, 0, 0), (0, 0, 1)}


def test_a_path_is_accepted_as_deep_as_the_tree_follows_it():
    tree = {(0,), (0, 0), (1,), (1, 2)}
    assert accepted(tree, np.array([0, 0, 0])) == 2
    assert accepted(tree, np.array([1, 2, 0])) == 2
    assert accepted(tree, np.array([1, 0])) == 1
    assert accepted(tree, np.array([NOT_IN_TOP, 0])) == 0


def test_sure_rows_make_a_chain():
    probs = _rows(*[[1.0]] * 5)
    assert best_tree(probs, 3) == {(0,), (0, 0), (0, 0, 0)}
    assert accepted(best_tree(probs, 3), np.array([0, 0, 0, 0])) == 3


def test_ranks_are_of_the_targets_tokens_in_the_drafters_vocabulary():
    vocab = np.array([10, 11, 12, 13])  # the drafter's ids in the target's
    seq = {"tokens": [1, 2, 12, 10, 13], "reply_start": 2}
    logits = np.log(np.array([[[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]] * 2))  # A=2, R=2
    ranks, probs = row_ranks(vocab, seq, logits)
    # anchor 2 (pending 12): row 1 is 10 (the drafter's 4th best there), row 2 is 13 (its
    # 4th best there); anchor 3: row 1 is 13 (row 1's best), row 2 lies past the reply
    assert ranks.tolist() == [[3, 3], [0, NOT_IN_TOP]]
    np.testing.assert_allclose(probs[0, 0, :2], [0.4, 0.3], rtol=1e-6)
