"""The block drafter: a whole block of draft tokens from one pass of a small model whose
context is the target's own hidden states (DFlash-style; docs/DESIGN.md, "The block
drafter", gives the architecture and the file format).

Two facts organise the state kept here:

1. **Its context rows come from the target.** For every committed position t the decode
   loop hands over the target's last-layer output h_t (`observe_hidden`); the drafter
   fuses it (`fc`, a norm) and projects it with each layer's own k/v projections into a
   per-layer cache. The drafter never runs its layers over the context: a draft pass is
   only the block's query rows (the pending token, then mask rows).
2. **The cursor counts target-derived rows only.** Rows cover positions [base, cursor)
   of `tokens`, the committed context. A draft's own rows are never stored: a pass
   concatenates them to the context for its attention and drops them, so nothing a draft
   wrote can be read as context later. `propose` checks that every committed token has
   its row (cursor == len(tokens)) and fails loudly rather than draft from stale rows.

Causal attention inside the block makes the first k + 1 rows of a pass exactly what the
full block gives those rows, so any k <= block - 1 drafts the same tokens.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.drafters import Draft, Sampler
from engine.errors import ModelLoadError, StateError
from engine.kv_state import FullKV
from engine.models.base import DecoderModel, ModelConfig
from engine.tokenizer import Tokenizer
from kernels.ops import Array, Ops

FORMAT = "branchchat-block-drafter"
VERSION = "1"
DEFAULT_FILE = Path(__file__).parent / "drafters" / "smollm2-135m-instruct-block.safetensors"


def target_signature(config: ModelConfig, tokenizer: Tokenizer) -> str:
    """What a drafter file must name to run on this target: its shapes and its token
    strings (any quantization of the model fits; another model or tokenizer does not)."""
    hf = tokenizer.hf
    vocab = tokenizer.vocab_size
    dims = {
        "hidden": config.hidden_size,
        "layers": config.num_layers,
        "heads": config.num_heads,
        "kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab": config.vocab_size,
    }
    digest = hashlib.sha256(json.dumps(dims, sort_keys=True).encode())
    for i in range(vocab):
        digest.update((hf.id_to_token(i) or "").encode() + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class DrafterShape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    block: int  # rows of a pass in training: the pending token and block - 1 masks
    rope_base: float
    eps: float


_LAYER_TENSORS = (
    "input_norm.weight",
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "o_proj.weight",
    "post_norm.weight",
    "gate_proj.weight",
    "up_proj.weight",
    "down_proj.weight",
)


def _read(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    import mlx.core as mx  # the one safetensors reader the engine already uses

    if not path.is_file():
        raise ModelLoadError(path, "no block drafter file here")
    try:
        loaded: Any = mx.load(str(path), format="safetensors", return_metadata=True)
    except Exception as exc:
        raise ModelLoadError(path, f"corrupt or truncated drafter file ({exc})") from None
    arrays, meta = loaded
    return {name: np.array(a) for name, a in arrays.items()}, dict(meta or {})


def _int(meta: dict[str, str], key: str, path: Path) -> int:
    try:
        return int(meta[key])
    except (KeyError, ValueError):
        raise ModelLoadError(path, f"drafter metadata {key!r} is missing or not a number") from None


class BlockDrafterWeights:
    """A drafter file checked against the target it is to run on, its weights in the
    target's ops. Every refusal names the file and what does not fit."""

    def __init__(self, path: Path, target: DecoderModel, signature: str) -> None:
        """`signature`: the target's `target_signature`."""
        arrays, meta = _read(path)
        self.path = path
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise ModelLoadError(
                path,
                f"not a {FORMAT} file of version {VERSION} "
                f"(format {meta.get('format')!r}, version {meta.get('version')!r})",
            )
        cfg = target.config
        if meta.get("target_check") != signature:
            raise ModelLoadError(
                path,
                f"trained for {meta.get('target', 'another model')!r}, not this model "
                "(its shapes or token strings differ)",
            )
        shape = DrafterShape(
            layers=_int(meta, "layers", path),
            heads=_int(meta, "heads", path),
            kv_heads=_int(meta, "kv_heads", path),
            head_dim=_int(meta, "head_dim", path),
            hidden=cfg.hidden_size,
            intermediate=_int(meta, "intermediate", path),
            block=_int(meta, "block", path),
            rope_base=float(meta.get("rope_base", cfg.rope_theta)),
            eps=float(meta.get("rms_eps", cfg.rms_norm_eps)),
        )
        self.shape, self.meta = shape, meta
        D, F = shape.hidden, shape.intermediate
        q_out, kv_out = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        expected = {
            "fc.weight": (D, D),
            "hidden_norm.weight": (D,),
            "mask_embedding": (D,),
            "final_norm.weight": (D,),
        }
        per_layer = dict(
            zip(
                _LAYER_TENSORS,
                [
                    (D,),
                    (q_out, D),
                    (kv_out, D),
                    (kv_out, D),
                    (D, q_out),
                    (D,),
                    (F, D),
                    (F, D),
                    (D, F),
                ],
                strict=True,
            )
        )
        for i in range(shape.layers):
            expected.update({f"layers.{i}.{name}": dims for name, dims in per_layer.items()})
        for name, dims in expected.items():
            if name not in arrays:
                raise ModelLoadError(path, f"tensor {name!r} is missing")
            if tuple(arrays[name].shape) != dims:
                raise ModelLoadError(
                    path,
                    f"tensor {name!r} is {tuple(arrays[name].shape)}, this target needs {dims}",
                )
        vocab = arrays.get("vocab")
        if vocab is None or vocab.ndim != 1 or not len(vocab):
            raise ModelLoadError(
                path, "tensor 'vocab' (the draft vocabulary's token ids) is missing"
            )
        vocab = vocab.astype(np.int64)
        if vocab.min() < 0 or vocab.max() >= cfg.vocab_size or len(np.unique(vocab)) != len(vocab):
            raise ModelLoadError(
                path, "the draft vocabulary names ids outside this target's vocabulary"
            )
        unused = sorted(set(arrays) - set(expected) - {"vocab"})
        if unused:  # a tensor nothing consumes: a file of another layout, refused
            raise ModelLoadError(path, f"tensors this drafter format does not use: {unused[:4]}")

        ops = target.ops
        f32 = {
            name: np.asarray(a, dtype=np.float32) for name, a in arrays.items() if name != "vocab"
        }
        self.vocab = vocab
        self.fc = ops.weight(f32["fc.weight"])
        self.hidden_norm = ops.norm_weight(f32["hidden_norm.weight"])
        self.mask_embedding = ops.asarray(f32["mask_embedding"][None, :])
        self.final_norm = ops.norm_weight(f32["final_norm.weight"])
        # the head: the target's own (tied) embedding rows of the draft vocabulary
        head_rows = np.asarray(ops.to_numpy(ops.embed(target.embed, vocab)), dtype=np.float32)
        self.head = ops.weight(head_rows)
        self.layers = [
            {
                name.split(".")[0]: (ops.norm_weight if "norm" in name else ops.weight)(
                    f32[f"layers.{i}.{name}"]
                )
                for name in _LAYER_TENSORS
            }
            for i in range(shape.layers)
        ]
        self.nbytes = sum(a.nbytes for a in f32.values()) + head_rows.nbytes


class BlockDrafter:
    """The Drafter protocol (engine/drafters.py) with the hidden-state extension: the
    decode loop calls `observe_hidden(rows)` with the target's rows of the tokens the
    next `commit` adds, and the prompt's rows after `begin`."""

    wants_hidden = True
    drafts_in_one_pass = True  # a pass costs about the same for any k (the cost model)

    def __init__(self, weights: BlockDrafterWeights, target: DecoderModel) -> None:
        self.w, self.target = weights, target
        self.ops: Ops = target.ops
        s = weights.shape
        self.tokens: list[int] = []  # the committed context
        self.base = 0  # first position with a row
        self.kv = [FullKV(self.ops, s.kv_heads, s.head_dim) for _ in range(s.layers)]
        self._sample: Sampler | None = None

    @property
    def cursor(self) -> int:
        """The position after the last target-derived row."""
        return self.base + self.kv[0].length

    @property
    def max_draft(self) -> int:
        return self.w.shape.block - 1

    def couple(self, sample: Sampler | None) -> None:
        """Draw drafts with the request's sampler (None: greedy) until the request ends."""
        self._sample = sample

    # -- the context --------------------------------------------------------------------
    def begin(self, context: list[int]) -> None:
        """A new request over `context`: rows of the shared prefix stay; the prompt's new
        rows come next through `observe_hidden(rows, start)`."""
        self._sample = None
        lcp = 0
        for a, b in zip(self.tokens, context, strict=False):
            if a != b:
                break
            lcp += 1
        self.tokens = list(context)
        self._cut(min(lcp, self.cursor))

    def observe_hidden(self, rows: Any, start: int | None = None) -> None:
        """The target's last-layer rows [n, D] for positions start.. (None: the cursor).
        Rows re-sent for positions already held replace them with the same values; a gap
        after the cursor drops the older rows (the context then starts at `start`)."""
        rows = self.ops.asarray(rows)
        n = int(rows.shape[0])
        start = self.cursor if start is None else start
        if start > self.cursor:
            self._reset(start)
        elif start < self.cursor:
            if start < self.base:  # rows before the context's start: keep from base on
                rows, n, start = rows[self.base - start :], n - (self.base - start), self.base
            self._cut(start)
        if n > 0:
            self._append(rows, start)

    def commit(self, tokens: list[int]) -> None:
        """`tokens` (the pending one first) joined the context; their rows came before."""
        self.tokens.extend(tokens)
        if self.cursor != len(self.tokens):
            raise StateError(
                f"the block drafter holds rows up to position {self.cursor} but the context "
                f"is {len(self.tokens)} tokens: a capture was missed or repeated"
            )

    def end(self) -> None:
        self._sample = None

    def _cut(self, position: int) -> None:
        keep = max(0, position - self.base)
        for kv in self.kv:
            kv.length = min(kv.length, keep)

    def _reset(self, base: int) -> None:
        self.base = base
        for kv in self.kv:
            kv.length = 0

    def _append(self, h: Array, start: int) -> None:
        """Context K/V of positions start.. from the target's rows h."""
        ops, s = self.ops, self.w.shape
        c = ops.rms_norm(ops.linear(h, self.w.fc), self.w.hidden_norm, s.eps)
        n = int(h.shape[0])
        for layer, kv in zip(self.w.layers, self.kv, strict=True):
            k = self._heads(ops.linear(c, layer["k_proj"]), s.kv_heads)
            v = self._heads(ops.linear(c, layer["v_proj"]), s.kv_heads)
            kv.append(self._rope(k, start), v)
        assert self.cursor == start + n

    # -- drafting -----------------------------------------------------------------------
    def propose(self, pending: int, k: int) -> Draft:
        k = min(k, self.max_draft)
        if k <= 0:
            return Draft([])
        if self.cursor != len(self.tokens) or self.kv[0].length == 0:
            raise StateError(
                f"the block drafter's rows end at position {self.cursor}, its context at "
                f"{len(self.tokens)}: it would draft from stale rows"
            )
        logits = self.ops.to_numpy(self.block_logits(pending, k))
        drafted: list[int] = []
        history = [*self.tokens, pending]
        for row in logits:
            if self._sample is None:
                token = int(self.w.vocab[int(np.argmax(row))])
            else:  # q over the whole vocabulary: nothing outside the draft vocabulary
                full = np.full(self.target.config.vocab_size, -np.inf)
                full[self.w.vocab] = row
                token = self._sample(full, history)
            drafted.append(token)
            history.append(token)
        return Draft(drafted)

    def block_logits(self, pending: int, k: int) -> Array:
        """Draft-vocabulary logits [k, N] of the block rows 1..k after `pending`."""
        ops, s, w = self.ops, self.w.shape, self.w
        P, L = self.cursor, k + 1
        x0 = ops.embed(self.target.embed, np.asarray([pending], dtype=np.int64))
        if self.target.config.embed_scale != 1.0:
            x0 = x0 * self.target.config.embed_scale
        x = ops.concat([x0, ops.concat([w.mask_embedding] * k, axis=0)], axis=0)
        n = self.kv[0].length
        mask = np.ones((L, n + L), dtype=bool)
        mask[:, n:] = np.tril(np.ones((L, L), dtype=bool))
        for layer, kv in zip(w.layers, self.kv, strict=True):
            a = ops.rms_norm(x, layer["input_norm"], s.eps)
            q = self._rope(self._heads(ops.linear(a, layer["q_proj"]), s.heads), P)
            kb = self._rope(self._heads(ops.linear(a, layer["k_proj"]), s.kv_heads), P)
            vb = self._heads(ops.linear(a, layer["v_proj"]), s.kv_heads)
            keys = ops.concat([kv.keys[:, :n], kb.astype(kv.keys.dtype)], axis=1)
            values = ops.concat([kv.values[:, :n], vb.astype(kv.values.dtype)], axis=1)
            att = ops.attention(q, keys, values, s.head_dim**-0.5, mask)
            x = x + ops.linear(self._rows(att), layer["o_proj"])
            b = ops.rms_norm(x, layer["post_norm"], s.eps)
            gate, up = ops.linear(b, layer["gate_proj"]), ops.linear(b, layer["up_proj"])
            x = x + ops.linear(ops.silu(gate) * up, layer["down_proj"])
        out = ops.linear(ops.rms_norm(x[1:], w.final_norm, s.eps), w.head)
        ops.evaluate(out)
        return out

    def _heads(self, x: Array, heads: int) -> Array:
        """[L, heads * Dh] -> [heads, L, Dh]"""
        L = int(x.shape[0])
        return x.reshape(L, heads, self.w.shape.head_dim).transpose(1, 0, 2)

    def _rows(self, x: Array) -> Array:
        """[heads, L, Dh] -> [L, heads * Dh]"""
        H, L, Dh = (int(d) for d in x.shape)
        return x.transpose(1, 0, 2).reshape(L, H * Dh)

    def _rope(self, x: Array, offset: int) -> Array:
        s = self.w.shape
        return self.ops.rope(x, offset, s.head_dim, s.rope_base, False)

    @property
    def nbytes(self) -> int:
        """Weights and context rows held."""
        return self.w.nbytes + sum(
            self.ops.nbytes(b) for kv in self.kv for b in (kv.keys, kv.values) if b is not None
        )


def load_block_drafter(
    setting: str | None, target: DecoderModel, tokenizer: Tokenizer
) -> tuple[BlockDrafter | None, str]:
    """The block drafter `setting` names (None: the one shipped for this model, if any;
    "off": none) and "" or, when a named one cannot run here, why."""
    if setting == "off":
        return None, ""
    path = DEFAULT_FILE if setting is None else Path(setting).expanduser()
    if setting is None and not path.is_file():
        return None, ""
    try:
        signature = target_signature(target.config, tokenizer)
        if setting is None and not _fits(path, signature):
            return None, ""  # shipped for another model: this one has none
        _check_digest(path)
        weights = BlockDrafterWeights(path, target, signature)
    except ModelLoadError as exc:
        return None, f"block drafter not used: {exc}"
    return BlockDrafter(weights, target), ""


def _fits(path: Path, signature: str) -> bool:
    import mlx.core as mx

    try:
        loaded: Any = mx.load(str(path), format="safetensors", return_metadata=True)
    except Exception:
        return True  # unreadable: the full load says what is wrong
    return dict(loaded[1] or {}).get("target_check") == signature


def _check_digest(path: Path) -> None:
    """A file with a `.sha256` beside it (the shipped one) must match it."""
    sidecar = path.with_name(path.name + ".sha256")
    if not sidecar.is_file():
        return
    want = sidecar.read_text().split()[0]
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != want:
        raise ModelLoadError(path, f"sha256 {got[:16]}... is not the recorded {want[:16]}...")
