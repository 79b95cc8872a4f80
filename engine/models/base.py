"""What every model family shares: the config, the weights container, the attention and
MLP blocks and the decoder-stack forward. A family file only maps its config and
tensor names onto these.

Shapes: no batch dimension (one sequence at a time). x is [L, D] (rows = tokens);
attention heads are [H, L, Dh].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import ModelLoadError
from engine.models.rope import Rope, RopeScaling
from engine.sequence import SequenceState
from engine.state import FullKV, LayerState, RecurrentState, SlidingKV, SnapshotPolicy
from kernels.ops import Array, Ops

FULL, SLIDING, LINEAR = "full_attention", "sliding_attention", "linear_attention"


@dataclass(frozen=True)
class ModelConfig:
    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_traditional: bool = False
    rope_scaling: RopeScaling | None = None
    rope_local_theta: float = 0.0  # Gemma 3: sliding layers' base (0: rope_theta, unscaled)
    rotary_dim: int = 0  # 0: the whole head
    attention_bias: bool = False  # q/k/v projections carry biases (Qwen2)
    query_pre_attn_scalar: float = 0.0  # attention scale is its ** -0.5 (0: head_dim)
    hidden_act: str = "silu"  # the gated MLP's activation: "silu" or "gelu_tanh"
    embed_scale: float = 1.0  # Gemma scales embeddings by sqrt(hidden_size)
    context_length: int = 4096
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    attn_output_gate: bool = False
    norm_offset: float = 0.0  # Qwen3.5 stores RMSNorm weights zero-centred (w = 1 + stored)
    sliding_window: int = 0
    layer_types: tuple[str, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    quantization: str = "float"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"config field {name} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError("layer_types must name one type per layer")
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"hidden activation {self.hidden_act!r} is not supported")

    def layer_type(self, i: int) -> str:
        if self.layer_types:
            return self.layer_types[i]
        return SLIDING if self.sliding_window else FULL

    @property
    def rope_dims(self) -> int:
        return self.rotary_dim or self.head_dim


def text_model_renamer(
    dropped: tuple[str, ...], renamed: tuple[tuple[str, str], ...]
) -> Callable[[str], str]:
    """A family's `canonical_name` for checkpoints that wrap the text model (vision-language
    exports): names under a `dropped` prefix become "" (not read), a `renamed` prefix gives
    way to its canonical `model.` / `lm_head.`, any other name stays as it is."""

    def canonical_name(name: str) -> str:
        if name.startswith(dropped):
            return ""
        for prefix, canonical in renamed:
            if name.startswith(prefix):
                return canonical + name[len(prefix) :]
        return name

    return canonical_name


class Weights:
    """Tensors by canonical (Hugging Face) name, with errors that name file and tensor.
    Remembers which tensors a build read, so a load can refuse the ones nothing read."""

    def __init__(self, tensors: dict[str, Any], source: str, name_of: dict[str, str] | None = None):
        self.tensors = tensors
        self.source = source
        self.name_of = name_of or {}  # canonical name -> name in the file, for messages
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def skip(self, name: str) -> None:
        """A tensor the reference implementation ignores too (a tied lm_head copy)."""
        self.used.add(name)

    def unused(self) -> list[str]:
        """Names in the file of the tensors no build step read."""
        return sorted(self.name_of.get(n, n) for n in self.tensors if n not in self.used)

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> Any:
        if name not in self.tensors:
            raise ModelLoadError(self.source, f"missing tensor {self.name_of.get(name, name)!r}")
        self.used.add(name)
        t = self.tensors[name]
        if shape is not None:
            actual = tuple(t.shape)
            if actual != tuple(shape):
                raise ModelLoadError(
                    self.source,
                    f"tensor {self.name_of.get(name, name)!r} has shape {actual}, "
                    f"expected {tuple(shape)}",
                )
        return t


class Linear:
    """A linear layer's weight in the backend's preferred layout."""

    def __init__(self, ops: Ops, w: Any) -> None:
        self.w = ops.weight(w)

    @classmethod
    def concatenated(cls, ops: Ops, ws: list[Any]) -> Linear:
        """Several projections' rows in one weight (q|k|v, gate|up): one matmul for all."""
        layer = cls.__new__(cls)
        layer.w = ops.concat_weights([ops.weight(w) for w in ws])
        return layer


def load_linear(ops: Ops, weights: Weights, name: str, out_dim: int, in_dim: int) -> Any:
    """The raw tensor (dense or quantized) after checking its logical shape."""
    return weights.get(name, (out_dim, in_dim))


def default_rope(cfg: ModelConfig, freq_factors: Any = None) -> Rope:
    """The rope of a full-attention layer: rope_theta with the config's scaling."""
    factors = None if freq_factors is None else np.asarray(freq_factors, dtype=np.float64)
    return Rope(cfg.rope_dims, cfg.rope_theta, cfg.rope_traditional, cfg.rope_scaling, factors)


class AttentionBlock:
    """Multi-head attention with GQA; optional q/k/v biases, q/k RMSNorm, output gate,
    partial or scaled rope."""

    def __init__(
        self, ops: Ops, cfg: ModelConfig, weights: Weights, prefix: str, rope: Rope | None = None
    ) -> None:
        self.ops, self.cfg = ops, cfg
        self.rope = rope or default_rope(cfg)
        D, H, Hkv, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_out = H * Dh * (2 if cfg.attn_output_gate else 1)
        parts = [
            load_linear(ops, weights, f"{prefix}.q_proj.weight", q_out, D),
            load_linear(ops, weights, f"{prefix}.k_proj.weight", Hkv * Dh, D),
            load_linear(ops, weights, f"{prefix}.v_proj.weight", Hkv * Dh, D),
        ]
        self.qkv = Linear.concatenated(ops, parts)
        self.qkv_bias = None
        if cfg.attention_bias:  # one bias vector over the fused q|k|v rows
            sizes = (q_out, Hkv * Dh, Hkv * Dh)
            biases = [
                ops.norm_weight(weights.get(f"{prefix}.{name}.bias", (size,)))
                for name, size in zip(("q_proj", "k_proj", "v_proj"), sizes, strict=True)
            ]
            self.qkv_bias = ops.concat(biases, axis=0)
        self.o = Linear(ops, load_linear(ops, weights, f"{prefix}.o_proj.weight", D, H * Dh))
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = norm_weight(ops, cfg, weights.get(f"{prefix}.q_norm.weight", (Dh,)))
            self.k_norm = norm_weight(ops, cfg, weights.get(f"{prefix}.k_norm.weight", (Dh,)))
        self.splits = [q_out, Hkv * Dh, Hkv * Dh]
        self.scale = (cfg.query_pre_attn_scalar or Dh) ** -0.5

    def __call__(self, x: Array, kv: FullKV | SlidingKV, offset: int) -> Array:
        ops, cfg = self.ops, self.cfg
        L = int(x.shape[0])
        H, Hkv, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qkv = ops.linear(x, self.qkv.w)
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        q, k, v = ops.split(qkv, self.splits, axis=-1)
        gate = None
        if cfg.attn_output_gate:  # Qwen3.5: q_proj emits [query | gate] per head
            qg = q.reshape(L, H, 2 * Dh)
            q, gate = qg[..., :Dh], qg[..., Dh:].reshape(L, H * Dh)
        q = q.reshape(L, H, Dh).transpose(1, 0, 2)  # [H, L, Dh]
        k = k.reshape(L, Hkv, Dh).transpose(1, 0, 2)  # [Hkv, L, Dh]
        v = v.reshape(L, Hkv, Dh).transpose(1, 0, 2)
        if self.q_norm is not None:
            q = ops.rms_norm(q, self.q_norm, cfg.rms_norm_eps)
            k = ops.rms_norm(k, self.k_norm, cfg.rms_norm_eps)
        q, k = self.rope(ops, q, offset), self.rope(ops, k, offset)
        keys, values, mask = kv.append(k, v)
        o = ops.attention(q, keys, values, self.scale, mask)  # [H, L, Dh]
        o = o.transpose(1, 0, 2).reshape(L, H * Dh)
        if gate is not None:
            o = o * ops.sigmoid(gate)
        return ops.linear(o, self.o.w)


class MLP:
    def __init__(self, ops: Ops, cfg: ModelConfig, weights: Weights, prefix: str) -> None:
        self.ops = ops
        D, F = cfg.hidden_size, cfg.intermediate_size
        gate = load_linear(ops, weights, f"{prefix}.gate_proj.weight", F, D)
        up = load_linear(ops, weights, f"{prefix}.up_proj.weight", F, D)
        self.gate_up = Linear.concatenated(ops, [gate, up])
        self.down = Linear(ops, load_linear(ops, weights, f"{prefix}.down_proj.weight", D, F))
        self.F = F
        self.act = ops.gelu_tanh if cfg.hidden_act == "gelu_tanh" else ops.silu

    def __call__(self, x: Array) -> Array:
        ops = self.ops
        gate, up = ops.split(ops.linear(x, self.gate_up.w), [self.F, self.F], axis=-1)
        return ops.linear(self.act(gate) * up, self.down.w)


def norm_weight(ops: Ops, cfg: ModelConfig, w: Any) -> Array:
    """A norm weight in the backend, with the family's stored offset added."""
    dense = ops.norm_weight(w)
    return dense + cfg.norm_offset if cfg.norm_offset else dense


class DecoderLayer:
    """Pre-norm residual block: mixer (attention or recurrent) then MLP."""

    def __init__(self, ops: Ops, cfg: ModelConfig, weights: Weights, i: int, mixer: Any):
        p = f"model.layers.{i}"
        D = cfg.hidden_size
        self.ops, self.cfg, self.mixer = ops, cfg, mixer
        self.input_norm = norm_weight(ops, cfg, weights.get(f"{p}.input_layernorm.weight", (D,)))
        self.post_norm = norm_weight(
            ops, cfg, weights.get(f"{p}.post_attention_layernorm.weight", (D,))
        )
        self.mlp = MLP(ops, cfg, weights, f"{p}.mlp")

    def __call__(self, x: Array, layer_state: LayerState, offset: int) -> Array:
        eps = self.cfg.rms_norm_eps
        h = x + self.mixer(self.ops.rms_norm(x, self.input_norm, eps), layer_state, offset)
        return h + self.mlp(self.ops.rms_norm(h, self.post_norm, eps))


class DecoderModel:
    """Embedding, a stack of decoder layers, final norm and the LM head."""

    layer_class: type = DecoderLayer  # a family with other norms around its blocks swaps it

    def __init__(self, ops: Ops, cfg: ModelConfig, weights: Weights, mixers: list[Any]):
        self.ops, self.config = ops, cfg
        V, D = cfg.vocab_size, cfg.hidden_size
        self.embed = ops.weight(weights.get("model.embed_tokens.weight", (V, D)))
        self.layers = [self.layer_class(ops, cfg, weights, i, m) for i, m in enumerate(mixers)]
        self.norm = norm_weight(ops, cfg, weights.get("model.norm.weight", (D,)))
        if cfg.tie_word_embeddings or not weights.has("lm_head.weight"):
            self.lm_head = self.embed
            weights.skip("lm_head.weight")  # tied: HF overwrites it with the embedding too
        else:
            self.lm_head = ops.weight(weights.get("lm_head.weight", (V, D)))

    def unfused_features(self) -> list[str]:
        """What this model computes that the fused decode kernels do not."""
        cfg = self.config
        named = {
            "attention biases": cfg.attention_bias,
            "scaled rope": any(not rope.is_plain for rope in self._ropes()),
            # plain up to max_position_embeddings, refused past it: the kernels do not check
            "dynamic rope": any(rope.max_positions for rope in self._ropes()),
            "norm offsets": bool(cfg.norm_offset),
            "an attention scale other than head_dim ** -0.5": bool(cfg.query_pre_attn_scalar),
            f"the {cfg.hidden_act} activation": cfg.hidden_act != "silu",
            "embedding scale": cfg.embed_scale != 1.0,
            "extra norms around the blocks": self.layer_class is not DecoderLayer,
        }
        return [name for name, present in named.items() if present]

    def _ropes(self) -> list[Rope]:
        """The attention layers' ropes (recurrent mixers rotate nothing)."""
        return [r for layer in self.layers if (r := getattr(layer.mixer, "rope", None))]

    def new_layer_state(self, i: int, policy: SnapshotPolicy) -> LayerState:
        cfg, ops = self.config, self.ops
        kind = cfg.layer_type(i)
        if kind == FULL:
            return FullKV(ops, cfg.num_kv_heads, cfg.head_dim, cfg.context_length)
        if kind == SLIDING:
            return SlidingKV(
                ops, cfg.num_kv_heads, cfg.head_dim, cfg.sliding_window, policy.sliding_slack
            )
        if kind == LINEAR:
            mixer = self.layers[i].mixer
            return RecurrentState(ops, *mixer.state_shape())
        raise ValueError(f"unknown layer type {kind!r}")

    def new_state(self, policy: SnapshotPolicy | None = None) -> SequenceState:
        policy = policy or SnapshotPolicy()
        layers = [self.new_layer_state(i, policy) for i in range(self.config.num_layers)]
        return SequenceState(self.ops, layers, policy)

    def forward(self, token_ids: list[int], state: SequenceState, logits: str = "last") -> Array:
        """Append `token_ids` to `state`; logits for "all" rows, the "last" row, or "none"."""
        return self.forward_hidden(token_ids, state, logits)[0]

    def forward_hidden(
        self,
        token_ids: list[int],
        state: SequenceState,
        logits: str = "last",
        taps: tuple[int, ...] = (),
    ) -> tuple[Array, Array]:
        """`forward`, and the last layer's output rows [L, D] (before the final norm); with
        `taps`, those layers' outputs side by side [L, len(taps) * D]."""
        if not token_ids:
            raise ValueError("forward needs at least one token")
        ops = self.ops
        offset = state.begin_forward(len(token_ids))
        tapped: list[Array] = []
        try:
            ids = np.asarray(token_ids, dtype=np.int64)
            x = self.hidden(ids, state.layers, offset, taps, tapped.append)
            out = None
            if logits != "none":
                out = self.logits(x if logits == "all" else x[-1:])
                ops.evaluate(out)
            else:
                ops.evaluate(*[a for s in state.layers for a in s.live_arrays()])
            state.end_forward(list(token_ids))
        except BaseException:  # out of memory, a stop signal, a bug: undo, then report it
            state.abort_forward()
            raise
        return out, (ops.concat(tapped, axis=-1) if taps else x)

    def hidden(
        self,
        ids: Any,
        layer_states: list[Any],
        offset: Any,
        taps: tuple[int, ...] = (),
        tap: Any = None,
    ) -> Array:
        """The last hidden states [L, D] for token ids appended at `offset`; each layer in
        `taps` hands its output to `tap` on the way."""
        x = self.ops.embed(self.embed, ids)
        if self.config.embed_scale != 1.0:
            x = x * self.config.embed_scale
        for i, (layer, layer_state) in enumerate(zip(self.layers, layer_states, strict=True)):
            x = layer(x, layer_state, offset)
            if i in taps:
                tap(x)
            self.ops.start(x)  # a GPU may run this layer while the next one is built
        return x

    def logits(self, h: Array) -> Array:
        return self.ops.linear(
            self.ops.rms_norm(h, self.norm, self.config.rms_norm_eps), self.lm_head
        )
