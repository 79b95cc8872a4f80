"""Qwen3.5 / Qwen3-Next hybrid: Gated DeltaNet layers with one gated full-attention layer in
every `full_attention_interval` (3 linear : 1 full in the released models).

The linear layers are Gated DeltaNet (Yang, Kautz, Hatamizadeh, "Gated Delta Networks:
Improving Mamba2 with Delta Rule", 2024, arXiv:2412.06464): a short causal depthwise conv over
the concatenated q|k|v rows, L2-normalised q and k, a per-head matrix state updated by the gated
delta rule (kernels.gated_delta), and an output RMSNorm gated by SiLU(z). The full-attention
layers are base.AttentionBlock with per-head q/k RMSNorm, a sigmoid output gate and rope on
the first `rotary_dim` features of each head. Semantics follow Hugging Face transformers'
modeling_qwen3_next.py / modeling_qwen3_5.py.

On-disk layouts this file accepts, all mapped onto one forward:
- Qwen3.5 (HF): `model.language_model.*`, linear projections in_proj_qkv | in_proj_z |
  in_proj_b | in_proj_a, conv1d (C, 1, K), RMSNorm weights stored zero-centred (1 + w).
- Qwen3-Next (HF): `model.*`, fused in_proj_qkvz / in_proj_ba whose rows are grouped per key
  head; re-ordered here at load into the plain q|k|v, z, b, a order.
- MLX conversions (mlx-lm / mlx-vlm): `language_model.model.*`, conv1d (C, K, 1), and their
  sanitize() has already added 1 to the zero-centred norms, so no offset is applied again.
- GGUF `qwen35` (llama.cpp's convert_hf_to_gguf.py, engine/models/qwen3_5_gguf.py): norms
  stored as 1 + w, A as -exp(A_log), conv1d (C, K), and the value heads in tiled order
  (value head r * nk + g belongs to key head g; HF groups them, g * R + r), so key heads are
  tiled, not repeated in place, and no weight is permuted back.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.errors import ModelLoadError
from engine.models import llama, qwen3_5_gguf
from engine.models.base import (
    FULL,
    LINEAR,
    AttentionBlock,
    DecoderModel,
    Linear,
    ModelConfig,
    Weights,
    load_linear,
    text_model_renamer,
)
from engine.state import RecurrentState
from kernels.ops import Array, Ops, QuantizedWeight

HF_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_next")
GGUF_ARCHITECTURES = ("qwen35",)
GGUF_LAYER_NAMES = qwen3_5_gguf.LAYER_NAMES
GGUF_LAYER_TENSORS = qwen3_5_gguf.LAYER_TENSORS
config_from_gguf = qwen3_5_gguf.config_from_gguf

CHUNKED_ABOVE = 16  # rows; shorter runs (decode, verify) take the token-by-token kernel
L2_NORM_EPS = 1e-6  # HF's l2norm(x) = x * rsqrt(sum(x^2) + 1e-6), as in flash-linear-attention

_DROPPED = ("model.visual.", "visual.", "vision_tower.", "mtp.", "model.mtp.")
_RENAMED = (
    ("model.language_model.", "model."),  # HF Qwen3.5 (vision-language checkpoint)
    ("language_model.model.", "model."),  # mlx-lm / mlx-vlm conversions
    ("language_model.lm_head.", "lm_head."),
)


# the text model's canonical `model.*` / `lm_head.*` names; the vision and MTP are not read
canonical_name = text_model_renamer(_DROPPED, _RENAMED)


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    num_layers = int(cfg["num_hidden_layers"])
    layer_types = tuple(cfg.get("layer_types") or ())
    if not layer_types:
        interval = int(cfg.get("full_attention_interval") or 4)
        layer_types = tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers))
    unknown = sorted(set(layer_types) - {FULL, LINEAR})
    if unknown:
        raise ValueError(f"unsupported layer types {unknown}")
    # Newer configs nest rope settings in `rope_parameters` (older ones: top level, rope_scaling).
    rope = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "mrope"):  # mrope equals default rope for text positions
        raise ValueError(f"rope_type {rope_type!r} is not supported")
    H = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // H)
    factor = float(cfg.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 0.25)
    theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    return llama.config_from_hf(
        cfg,
        family=str(cfg.get("model_type") or "qwen3_5"),
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=None,  # checked above: mrope on text positions is the default rope
        rotary_dim=int(head_dim * factor),
        sliding_window=0,
        layer_types=layer_types,
        qk_norm=True,
        attn_output_gate=True,
        norm_offset=1.0,  # HF stores RMSNorm weights zero-centred: y = norm(x) * (1 + w)
        linear_num_key_heads=int(cfg.get("linear_num_key_heads", 16)),
        linear_num_value_heads=int(cfg.get("linear_num_value_heads", 32)),
        linear_key_head_dim=int(cfg.get("linear_key_head_dim", 128)),
        linear_value_head_dim=int(cfg.get("linear_value_head_dim", 128)),
        linear_conv_kernel_dim=int(cfg.get("linear_conv_kernel_dim", 4)),
    )


def _rows(w: Any, start: int, stop: int) -> Any:
    """Rows start:stop of a dense or quantized [out, in] weight (quantization is per row)."""
    if isinstance(w, QuantizedWeight):
        return QuantizedWeight(
            w.packed[start:stop], w.scales[start:stop], w.biases[start:stop],
            w.group_size, w.bits,
        )  # fmt: skip
    return w[start:stop]


def _per_head_pieces(w: Any, num_groups: int, sizes: list[int]) -> list[list[Any]]:
    """Rows grouped [group][piece] -> pieces[piece][group], each a row slice of w."""
    group_rows = sum(sizes)
    pieces: list[list[Any]] = [[] for _ in sizes]
    for g in range(num_groups):
        start = g * group_rows
        for j, size in enumerate(sizes):
            pieces[j].append(_rows(w, start, start + size))
            start += size
    return pieces


class GatedDeltaNet:
    """The linear-attention mixer; its per-sequence state is an engine.state.RecurrentState."""

    def __init__(self, ops: Ops, cfg: ModelConfig, weights: Weights, prefix: str) -> None:
        self.ops, self.cfg = ops, cfg
        D = cfg.hidden_size
        nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv, K = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
        if min(nk, nv, dk, dv, K) <= 0 or nv % nk:
            raise ModelLoadError(
                weights.source, f"bad linear-attention config: {nk} key heads, {nv} value heads"
            )
        self.nk, self.nv, self.dk, self.dv, self.K = nk, nv, dk, dv, K
        self.tiled = cfg.extra.get(qwen3_5_gguf.VALUE_HEAD_ORDER) == "tiled"
        self.key_dim, self.value_dim = nk * dk, nv * dv
        self.conv_dim = 2 * self.key_dim + self.value_dim  # conv channels: q | k | v

        if weights.has(f"{prefix}.in_proj_qkvz.weight"):
            parts = self._ungroup_fused(weights, prefix)
        else:
            parts = [
                load_linear(ops, weights, f"{prefix}.in_proj_qkv.weight", self.conv_dim, D),
                load_linear(ops, weights, f"{prefix}.in_proj_z.weight", self.value_dim, D),
                load_linear(ops, weights, f"{prefix}.in_proj_b.weight", nv, D),
                load_linear(ops, weights, f"{prefix}.in_proj_a.weight", nv, D),
            ]
        self.in_proj = Linear.concatenated(ops, parts)  # rows: q | k | v | z | b | a
        self.splits = [self.conv_dim, self.value_dim, nv, nv]

        conv_name = f"{prefix}.conv1d.weight"
        conv = weights.get(conv_name)
        shapes = [(self.conv_dim, 1, K), (self.conv_dim, K, 1), (self.conv_dim, K)]
        if tuple(conv.shape) not in shapes:
            raise ModelLoadError(
                weights.source,
                f"tensor {weights.name_of.get(conv_name, conv_name)!r} has shape "
                f"{tuple(conv.shape)}, expected one of {shapes}",
            )
        self.conv_weight = ops.norm_weight(conv.reshape(self.conv_dim, K))  # [C, K]
        if weights.has(f"{prefix}.A"):  # a GGUF's ssm_a: A = -exp(A_log) already
            self.neg_A = ops.norm_weight(weights.get(f"{prefix}.A", (nv,)))
        else:
            self.neg_A = -ops.exp(ops.norm_weight(weights.get(f"{prefix}.A_log", (nv,))))
        self.dt_bias = ops.norm_weight(weights.get(f"{prefix}.dt_bias", (nv,)))
        # RMSNormGated's weight is ones-initialised, not zero-centred: no norm_offset here.
        self.norm = ops.norm_weight(weights.get(f"{prefix}.norm.weight", (dv,)))
        out = load_linear(ops, weights, f"{prefix}.out_proj.weight", D, self.value_dim)
        self.out_proj = Linear(ops, out)

    def _ungroup_fused(self, weights: Weights, prefix: str) -> list[Any]:
        """Qwen3-Next's in_proj_qkvz rows are [nk, q dk | k dk | v R*dv | z R*dv] and in_proj_ba
        rows [nk, b R | a R] (R = nv / nk value heads per key head; HF's
        fix_query_key_value_ordering). Returns the row slices in plain q|k|v, z, b, a order."""
        D, nk, nv, dk, dv = self.cfg.hidden_size, self.nk, self.nv, self.dk, self.dv
        R = nv // nk
        qkvz = weights.get(
            f"{prefix}.in_proj_qkvz.weight", (2 * self.key_dim + 2 * self.value_dim, D)
        )
        ba = weights.get(f"{prefix}.in_proj_ba.weight", (2 * nv, D))
        q, k, v, z = _per_head_pieces(qkvz, nk, [dk, dk, R * dv, R * dv])
        b, a = _per_head_pieces(ba, nk, [R, R])
        return [*q, *k, *v, *z, *b, *a]

    def state_shape(self) -> tuple[int, int, int, int, int]:
        return (self.conv_dim, self.K, self.nv, self.dk, self.dv)

    def _repeat_heads(self, x: Array) -> Array:
        """[L, nk, d] -> [L, nv, d]: each key head repeated nv/nk times in a row (HF's grouped
        value heads), or the nk heads tiled nv/nk times (a GGUF's tiled value heads)."""
        L, _, d = (int(s) for s in x.shape)
        R = self.nv // self.nk
        if self.tiled:
            return self.ops.concat([x] * R, axis=1)
        return self.ops.concat([x[:, :, None]] * R, axis=2).reshape(L, self.nv, d)

    def __call__(self, x: Array, layer_state: RecurrentState, offset: int) -> Array:
        ops = self.ops
        L = int(x.shape[0])
        nk, nv, dk, dv = self.nk, self.nv, self.dk, self.dv
        mixed, z, b, a = ops.split(ops.linear(x, self.in_proj.w), self.splits, axis=-1)
        conv_out, conv_state = ops.causal_conv1d(mixed, self.conv_weight, layer_state.conv)
        q, k, v = ops.split(ops.silu(conv_out), [self.key_dim, self.key_dim, self.value_dim], -1)
        # l2norm(x) = x / sqrt(sum(x^2) + eps) = rms_norm(x, eps / d) / sqrt(d); q also * d^-0.5
        q = ops.rms_norm(q.reshape(L, nk, dk), None, L2_NORM_EPS / dk) * (1.0 / dk)
        k = ops.rms_norm(k.reshape(L, nk, dk), None, L2_NORM_EPS / dk) * (dk**-0.5)
        if nv != nk:
            q, k = self._repeat_heads(q), self._repeat_heads(k)
        v = v.reshape(L, nv, dv)
        g = self.neg_A * ops.softplus(a + self.dt_bias)  # [L, nv] log-decay, <= 0
        beta = ops.sigmoid(b)
        layer_state.record(mixed, q, k, v, g, beta)
        kernel = ops.gated_delta_chunked if L > CHUNKED_ABOVE else ops.gated_delta_recurrent
        o, ssm = kernel(q, k, v, g, beta, layer_state.ssm)  # o [L, nv, dv]
        layer_state.conv, layer_state.ssm, layer_state.length = conv_state, ssm, offset + L
        o = ops.rms_norm(o, self.norm, self.cfg.rms_norm_eps) * ops.silu(z.reshape(L, nv, dv))
        return ops.linear(o.reshape(L, self.value_dim), self.out_proj.w)


def _norms_already_shifted(cfg: ModelConfig, weights: Weights) -> bool:
    """MLX conversions store conv1d as (C, K, 1) and, in the same sanitize(), 1 + w norms."""
    for i in range(cfg.num_layers):
        name = f"model.layers.{i}.linear_attn.conv1d.weight"
        if cfg.layer_type(i) == LINEAR and weights.has(name):
            shape = tuple(weights.get(name).shape)
            return len(shape) == 3 and shape[-1] == 1 and cfg.linear_conv_kernel_dim != 1
    return False


def build(ops: Ops, cfg: ModelConfig, weights: Weights) -> DecoderModel:
    if _norms_already_shifted(cfg, weights):
        cfg = replace(cfg, norm_offset=0.0)
    qwen3_5_gguf.skip_mtp_layers(cfg, weights)
    mixers: list[Any] = []
    for i in range(cfg.num_layers):
        prefix = f"model.layers.{i}"
        if cfg.layer_type(i) == LINEAR:
            mixers.append(GatedDeltaNet(ops, cfg, weights, f"{prefix}.linear_attn"))
        else:
            mixers.append(AttentionBlock(ops, cfg, weights, f"{prefix}.self_attn"))
    return DecoderModel(ops, cfg, weights, mixers)
