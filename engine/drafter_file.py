"""The block drafter's file (format 1, docs/DESIGN.md "The block drafter"): read, checked
against the target it is to run on, its weights in the target's ops."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ModelLoadError
from engine.models.base import DecoderModel, ModelConfig
from engine.tokenizer import Tokenizer

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
    # the target layers whose outputs, side by side, make a context row (): the last's
    taps: tuple[int, ...] = ()

    @property
    def capture_width(self) -> int:
        """A context row's width before `fc`: D for each tapped layer."""
        return max(1, len(self.taps)) * self.hidden


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
    try:
        return {name: np.array(a) for name, a in arrays.items()}, dict(meta or {})
    except (TypeError, ValueError, RuntimeError) as exc:  # a dtype NumPy lacks (bfloat16)
        raise ModelLoadError(path, f"tensors of a type this format does not use ({exc})") from None


def _taps(text: str, num_layers: int, path: Path) -> tuple[int, ...]:
    """`target_layers` ("7,14,29": training's --taps) as layer numbers; () for the last
    layer's rows alone (absent, or naming only it)."""
    try:
        taps = tuple(int(t) for t in text.split(",")) if text.strip() else ()
    except ValueError:
        taps = (-1,)
    if taps and (list(taps) != sorted(set(taps)) or taps[0] < 0 or taps[-1] >= num_layers):
        raise ModelLoadError(
            path, f"target_layers {text!r}: not rising layer numbers of this target's {num_layers}"
        )
    return () if taps == (num_layers - 1,) else taps


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
        taps = _taps(meta.get("target_layers", ""), cfg.num_layers, path)
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
            taps=taps,
        )
        self.shape, self.meta = shape, meta
        D, F = shape.hidden, shape.intermediate
        q_out, kv_out = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        expected = {
            "fc.weight": (D, shape.capture_width),
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
        # the linears in the backend's compact form (Q8_0 on an int8 CPU): the drafter's
        # rounding changes what it proposes, never what the target accepts
        self.fc = ops.compact_weight(f32["fc.weight"])
        self.hidden_norm = ops.norm_weight(f32["hidden_norm.weight"])
        self.mask_embedding = ops.asarray(f32["mask_embedding"][None, :])
        self.final_norm = ops.norm_weight(f32["final_norm.weight"])
        # the head: the target's own (tied) embedding rows of the draft vocabulary
        head_rows = np.asarray(ops.to_numpy(ops.embed(target.embed, vocab)), dtype=np.float32)
        self.head = ops.compact_weight(head_rows)
        self.layers = [
            {
                name.split(".")[0]: (ops.norm_weight if "norm" in name else ops.compact_weight)(
                    f32[f"layers.{i}.{name}"]
                )
                for name in _LAYER_TENSORS
            }
            for i in range(shape.layers)
        ]
        for layer in self.layers:  # fused products: k|v (the context's rows too), gate|up
            layer["kv_proj"] = ops.concat_weights([layer.pop("k_proj"), layer.pop("v_proj")])
            layer["gate_up"] = ops.concat_weights([layer.pop("gate_proj"), layer.pop("up_proj")])


def read_metadata(path: Path) -> dict[str, str]:
    """A drafter file's metadata from its header alone ({} when unreadable: the full load
    says what is wrong)."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        return {str(k): str(v) for k, v in (header.get("__metadata__") or {}).items()}
    except (OSError, ValueError, AttributeError, struct.error):
        return {}


def check_digest(path: Path) -> None:
    """A file with a `.sha256` beside it (the shipped one) must match it."""
    sidecar = path.with_name(path.name + ".sha256")
    if not sidecar.is_file():
        return
    want = sidecar.read_text().split()[0]
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != want:
        raise ModelLoadError(path, f"sha256 {got[:16]}... is not the recorded {want[:16]}...")
