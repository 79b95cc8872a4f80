"""The drafter's training losses over block rows 1..B-1.

Hard labels: the cross-entropy of each row against the true next token (its index in the
draft vocabulary; -100: past the end or outside the vocabulary, ignored).

Distillation: the KL divergence from the target's own next-token distribution at that
position (the target's logits on the draft vocabulary, from the final norm and LM head
applied to the captures training already computes, so renormalised over the draft
vocabulary, at temperature `distill_temperature`) to the drafter's. Row j of the block at
anchor a drafts token a + j, which the target predicts from position a + j - 1 given
the true prefix; the hard label is one sample of that distribution (for a sampled reply)
or its argmax (for a greedy one), so the soft target carries the same signal without the
sampling noise, and says how sure the target was. Rows ignored by the hard loss are
ignored here too, so both losses weigh the same rows the same (exp(-(j-1)/gamma)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def row_weights(block: int, decay_gamma: float, device=None) -> torch.Tensor:
    """[B-1] loss weight of rows 1..B-1."""
    j = torch.arange(block - 1, dtype=torch.float32, device=device)
    return torch.exp(-j / decay_gamma) if decay_gamma > 0 else torch.ones_like(j)


def _row_mean(per_row: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor):
    w = weights.expand_as(targets).flatten() * (targets.flatten() != -100)
    return (per_row.flatten() * w).sum() / w.sum().clamp_min(1.0)


def block_loss(logits, targets, weights) -> torch.Tensor:
    """Weighted mean cross-entropy over the supervised rows; logits [..., B-1, N]."""
    ce = F.cross_entropy(
        logits.float().flatten(0, -2), targets.flatten(), ignore_index=-100, reduction="none"
    )
    return _row_mean(ce, targets, weights)


def anchor_positions(anchors: torch.Tensor, block: int, length: int) -> torch.Tensor:
    """[N, m, B-1] the position whose target distribution supervises each row: a + j - 1
    for row j of the block at a (clamped into the sequence; rows past it are ignored)."""
    offsets = torch.arange(block - 1, device=anchors.device)
    return (anchors[..., None] + offsets).clamp(max=length - 1)


def target_log_probs(target_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The target's distribution over the draft vocabulary (its logits restricted there,
    so renormalised), as log-probabilities, float32."""
    return F.log_softmax(target_logits.float() / temperature, dim=-1)


def row_target_logp(target, captures, anchors, vocab, block: int, temperature: float = 1.0):
    """[N, m, B-1, vocab] the target's log-distribution over `vocab` for each block row,
    from its captures [N, T, D] (target.vocab_logits: its final norm and LM head)."""
    N, T, D = captures.shape
    pos = anchor_positions(anchors.to(captures.device), block, T)
    rows = torch.gather(captures, 1, pos.flatten(1)[..., None].expand(-1, -1, D))
    logits = target.vocab_logits(rows.view(*pos.shape, D), vocab)
    return target_log_probs(logits, temperature)


def distill_loss(logits, target_logp, targets, weights) -> torch.Tensor:
    """Weighted mean KL(p_target || q_drafter) over the rows the hard loss supervises.
    logits, target_logp [..., B-1, N]; targets [..., B-1] (only its -100s are read).
    Its gradient in the drafter's logits is w (q - p) / sum(w): toward the target."""
    log_q = F.log_softmax(logits.float(), dim=-1)
    p = target_logp.exp()
    kl = (p * (target_logp - log_q)).sum(-1)
    return _row_mean(kl, targets, weights)


def mixed_loss(logits, targets, weights, target_logp, distill: float):
    """(the loss optimised, the hard cross-entropy): distill * KL + (1 - distill) * CE;
    target_logp may be None when distill is 0."""
    hard = block_loss(logits, targets, weights)
    if distill <= 0 or target_logp is None:
        return hard, hard.detach()
    soft = distill_loss(logits, target_logp, targets, weights)
    loss = soft if distill >= 1 else distill * soft + (1 - distill) * hard
    return loss, hard.detach()
