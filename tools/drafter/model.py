"""The block drafter of tools/drafter/README.md ("format 1") in torch.

A DFlash-style drafter (block diffusion for speculative decoding, z-lab's DFlash): the
target's final residual rows h_t become, through `fc` and a norm, the drafter's context
keys and values; one pass over a block of query rows [E[pending], mask, ..., mask] at
positions P..P+B-1 proposes B-1 tokens at once. Layers are pre-norm Llama blocks; block
row j attends to every context row and to block rows 0..j.

Two forms of one set of weights:
  draft_block    one block over one context, written out op by op (the fixtures' reference)
  train_forward  many blocks per sequence in one pass (an attention mask gives each block
                 its own context prefix), what training runs; tests check the two agree
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DrafterConfig:
    hidden: int = 576
    num_layers: int = 2
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    intermediate: int = 1536
    block: int = 16
    rope_base: float = 100000.0
    rms_eps: float = 1e-5
    vocab_size: int = 8192  # N, the draft vocabulary
    # the target layers whose outputs, side by side, make a context row (fc's input);
    # (): the last layer's alone, format 1 as the engine reads it
    target_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} query heads do not group over {self.num_kv_heads}")
        if self.block < 2:
            raise ValueError(f"a block of {self.block} rows drafts nothing (needs >= 2)")
        if min(self.num_layers, self.intermediate, self.vocab_size, self.head_dim) < 1:
            raise ValueError(f"a drafter needs positive sizes: {self}")

    @property
    def capture_width(self) -> int:
        """fc's input: a row of every tapped layer's output, D each."""
        return max(1, len(self.target_layers)) * self.hidden

    def as_dict(self) -> dict:
        return asdict(self)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm, the weight not offset by 1; in float32 at least (bfloat16 rows
    under autocast), float64 rows stay float64."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.to(wide.dtype)).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half rope: x [..., L, head_dim], positions [..., L] (broadcast over heads).
    Angles in float64 so every form of the drafter rotates by the same rounded angles."""
    half = x.shape[-1] // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float64, device=x.device) / half)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [..., L, half]
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        D, H, KV, hd, Fd = (
            cfg.hidden,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.intermediate,
        )
        self.cfg = cfg
        self.input_norm = nn.Parameter(torch.ones(D))
        self.q_proj = nn.Linear(D, H * hd, bias=False)
        self.k_proj = nn.Linear(D, KV * hd, bias=False)
        self.v_proj = nn.Linear(D, KV * hd, bias=False)
        self.o_proj = nn.Linear(H * hd, D, bias=False)
        self.post_norm = nn.Parameter(torch.ones(D))
        self.gate_proj = nn.Linear(D, Fd, bias=False)
        self.up_proj = nn.Linear(D, Fd, bias=False)
        self.down_proj = nn.Linear(Fd, D, bias=False)

    def heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """[..., L, n * hd] -> [..., n, L, hd]"""
        *lead, L, _ = x.shape
        return x.view(*lead, L, n, self.cfg.head_dim).transpose(-3, -2)

    def keys_values(
        self, rows: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K (roped) and V [..., KV, L, hd] of normed rows [..., L, D] at positions [..., L]."""
        KV = self.cfg.num_kv_heads
        k = rope(self.heads(self.k_proj(rows), KV), positions[..., None, :], self.cfg.rope_base)
        return k, self.heads(self.v_proj(rows), KV)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        b = rms_norm(x, self.post_norm, self.cfg.rms_eps)
        return x + self.down_proj(F.silu(self.gate_proj(b)) * self.up_proj(b))


class BlockDrafter(nn.Module):
    """The trainable drafter; `embedding` [V, D] is the target's frozen token table
    (row 0 of a block reads it, and the draft head is its `vocab` rows, as in the file)."""

    def __init__(self, cfg: DrafterConfig, embedding: torch.Tensor, vocab: torch.Tensor) -> None:
        super().__init__()
        if vocab.numel() != cfg.vocab_size:
            raise ValueError(f"{vocab.numel()} vocabulary ids for vocab_size {cfg.vocab_size}")
        if embedding.shape[1] != cfg.hidden:
            raise ValueError(f"embedding rows of {embedding.shape[1]}, drafter hidden {cfg.hidden}")
        D = cfg.hidden
        self.cfg = cfg
        self.fc = nn.Linear(cfg.capture_width, D, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(D))
        self.mask_embedding = nn.Parameter(torch.zeros(D))
        self.final_norm = nn.Parameter(torch.ones(D))
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.num_layers))
        # frozen and rebuilt from the target, so not in a checkpoint's state_dict
        self.register_buffer("embedding", embedding.float(), persistent=False)
        self.register_buffer("vocab", vocab.long(), persistent=True)

    def context_rows(self, captures: torch.Tensor) -> torch.Tensor:
        """c_t = rms_norm(fc(h_t)) * hidden_norm: captures [..., T, capture_width] ->
        [..., T, D] (h_t: the tapped layers' outputs at t, side by side)."""
        return rms_norm(self.fc(captures), self.hidden_norm, self.cfg.rms_eps)

    def draft_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final rows [..., D] -> logits over the draft vocabulary [..., N]."""
        head = self.embedding[self.vocab].to(x.dtype)
        return rms_norm(x, self.final_norm, self.cfg.rms_eps) @ head.T

    def block_inputs(self, pending: torch.Tensor, rows: int) -> torch.Tensor:
        """[..., rows, D]: E[pending] then mask_embedding rows; pending [...] token ids."""
        first = self.embedding[pending][..., None, :]
        masks = self.mask_embedding.expand(*pending.shape, rows - 1, self.cfg.hidden)
        return torch.cat([first, masks.to(first.dtype)], dim=-2)

    # -- the plain form: one block, each op as the spec writes it ----------------------
    def draft_block(self, captures: torch.Tensor, pending: int, rows: int) -> torch.Tensor:
        """Logits [rows - 1, N] of block rows 1..rows-1 for the context captures [P, D]
        (positions 0..P-1) and the pending token at position P."""
        cfg = self.cfg
        P = captures.shape[0]
        group = cfg.num_heads // cfg.num_kv_heads
        context = self.context_rows(captures)
        x = self.block_inputs(torch.tensor(pending, device=captures.device), rows)  # [R, D]
        ctx_pos = torch.arange(P, device=x.device)
        blk_pos = torch.arange(P, P + rows, device=x.device)
        # block row j sees all P context rows and block rows 0..j
        allowed = torch.cat(
            [torch.ones(rows, P, dtype=torch.bool), torch.ones(rows, rows).tril().bool()], dim=1
        ).to(x.device)
        for layer in self.layers:
            ctx_k, ctx_v = layer.keys_values(context, ctx_pos)  # [KV, P, hd]
            a = rms_norm(x, layer.input_norm, cfg.rms_eps)
            q = rope(layer.heads(layer.q_proj(a), cfg.num_heads), blk_pos, cfg.rope_base)
            blk_k, blk_v = layer.keys_values(a, blk_pos)
            k = torch.cat([ctx_k, blk_k], dim=1).repeat_interleave(group, dim=0)  # [H, P+R, hd]
            v = torch.cat([ctx_v, blk_v], dim=1).repeat_interleave(group, dim=0)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(cfg.head_dim)  # [H, R, P+R]
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            attn = (weights @ v).transpose(0, 1).reshape(rows, -1)  # [R, H * hd]
            x = layer.mlp(x + layer.o_proj(attn))
        return self.draft_logits(x[1:])

    # -- the training form: many blocks per sequence in one pass ----------------------
    def train_forward(self, captures: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor):
        """Logits [N, m, B-1, vocab] for m blocks per sequence.

        captures [N, T, D] (the target's rows for every position), tokens [N, T], anchors
        [N, m]: block i of sequence n has its pending token tokens[n, a] at a = anchors[n, i]
        and sees the context rows 0..a-1, exactly as a draft pass at a would.
        """
        cfg = self.cfg
        N, T, _ = captures.shape
        m, B = anchors.shape[1], cfg.block
        group = cfg.num_heads // cfg.num_kv_heads
        device = captures.device
        context = self.context_rows(captures)
        pending = torch.gather(tokens, 1, anchors)  # [N, m]
        x = self.block_inputs(pending, B).reshape(N, m * B, cfg.hidden).to(context.dtype)
        offsets = torch.arange(B, device=device)
        blk_pos = (anchors[:, :, None] + offsets).reshape(N, m * B)
        ctx_pos = torch.arange(T, device=device).expand(N, T)
        # [N, m*B, T]: a block's rows see the context before its anchor
        sees_context = (
            torch.arange(T, device=device) < anchors.repeat_interleave(B, dim=1)[..., None]
        )
        # [m*B, m*B]: and the rows of their own block up to themselves
        block_of = torch.arange(m, device=device).repeat_interleave(B)
        row_of = offsets.repeat(m)
        sees_block = (block_of[:, None] == block_of[None, :]) & (row_of[None, :] <= row_of[:, None])
        allowed = torch.cat([sees_context, sees_block.expand(N, -1, -1)], dim=2)[:, None]
        for layer in self.layers:
            ctx_k, ctx_v = layer.keys_values(context, ctx_pos)  # [N, KV, T, hd]
            a = rms_norm(x, layer.input_norm, cfg.rms_eps)
            q = rope(layer.heads(layer.q_proj(a), cfg.num_heads), blk_pos[:, None], cfg.rope_base)
            blk_k, blk_v = layer.keys_values(a, blk_pos)  # [N, KV, m*B, hd]
            k = torch.cat([ctx_k, blk_k], dim=2).repeat_interleave(group, dim=1)
            v = torch.cat([ctx_v, blk_v], dim=2).repeat_interleave(group, dim=1)
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # [N, H, m*B, hd]
            x = layer.mlp(x + layer.o_proj(attn.transpose(1, 2).reshape(N, m * B, -1)))
        rows = x.view(N, m, B, cfg.hidden)[:, :, 1:]
        return self.draft_logits(rows)


def init_weights(drafter: BlockDrafter, seed: int, std: float = 0.02) -> None:
    """GPT-2 style: normal(0, std) projections, the residual outputs scaled by 1/sqrt(2L);
    norms at one; the mask row at the mean token embedding (a row of the table's scale)."""
    gen = torch.Generator().manual_seed(seed)
    residual_std = std / math.sqrt(2 * drafter.cfg.num_layers)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.dim() == 2:
                scale = (
                    residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                )
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
        drafter.mask_embedding.copy_(drafter.embedding.mean(0))
