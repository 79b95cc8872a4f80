"""The drafter's weight file (format 1 of tools/drafter/README.md): one safetensors file,
float16 weights by default, the int32 draft vocabulary and string metadata the engine
checks against the loaded target; its sha256 printed and written beside it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from tools.drafter.model import BlockDrafter, DrafterConfig
from tools.drafter.safetensors_io import read_drafter_file, write_safetensors

FORMAT, VERSION = "branchchat-block-drafter", "1"
_LAYER_TENSORS = (
    "input_norm.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
    "post_norm.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight",
)  # fmt: skip


def file_tensors(drafter: BlockDrafter) -> dict[str, torch.Tensor]:
    """The file's tensors by the file's names ([out, in] like nn.Linear)."""
    out = {
        "fc.weight": drafter.fc.weight,
        "hidden_norm.weight": drafter.hidden_norm,
        "mask_embedding": drafter.mask_embedding,
        "final_norm.weight": drafter.final_norm,
    }
    for i, layer in enumerate(drafter.layers):
        for name in _LAYER_TENSORS:
            module, _ = name.split(".")
            value = getattr(layer, module)
            out[f"layers.{i}.{name}"] = (
                value.weight if isinstance(value, torch.nn.Linear) else value
            )
    return out


def export_drafter(
    drafter: BlockDrafter,
    path: str | Path,
    *,
    target_check: str,
    target_vocab: int,
    trained_tokens: int,
    steps: int,
    notes: str,
    dtype: type = np.float16,
    keep_float32: frozenset[str] = frozenset(),
) -> str:
    """Write the file at `path` and `path`.sha256 (sha256sum's format); returns the digest.
    Tensors named in keep_float32 stay float32 whatever `dtype` is."""
    cfg = drafter.cfg
    tensors = {
        name: t.detach().float().cpu().numpy().astype(np.float32 if name in keep_float32 else dtype)
        for name, t in file_tensors(drafter).items()
    }
    tensors["vocab"] = drafter.vocab.cpu().numpy().astype(np.int32)
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "target": "SmolLM2-135M-Instruct",
        "target_hidden": str(cfg.hidden),
        "target_vocab": str(target_vocab),
        "target_check": target_check,
        "block": str(cfg.block),
        "layers": str(cfg.num_layers),
        "heads": str(cfg.num_heads),
        "kv_heads": str(cfg.num_kv_heads),
        "head_dim": str(cfg.head_dim),
        "intermediate": str(cfg.intermediate),
        "rope_base": repr(cfg.rope_base),
        "rms_eps": repr(cfg.rms_eps),
        "trained_tokens": str(trained_tokens),
        "steps": str(steps),
        "notes": notes,
    }
    if cfg.target_layers:  # format 1 without it: the last layer's rows alone
        metadata["target_layers"] = ",".join(str(i) for i in cfg.target_layers)
    path = Path(path)
    write_safetensors(path, tensors, metadata)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    Path(f"{path}.sha256").write_text(f"{digest}  {path.name}\n", encoding="utf-8")
    return digest


def load_drafter(path: str | Path, embedding: torch.Tensor) -> BlockDrafter:
    """A BlockDrafter holding the file's weights (float32), for checks and fixtures."""
    tensors, meta = read_drafter_file(path)
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"{path}: not a {FORMAT} version {VERSION} file")
    cfg = DrafterConfig(
        hidden=int(meta["target_hidden"]),
        num_layers=int(meta["layers"]),
        num_heads=int(meta["heads"]),
        num_kv_heads=int(meta["kv_heads"]),
        head_dim=int(meta["head_dim"]),
        intermediate=int(meta["intermediate"]),
        block=int(meta["block"]),
        rope_base=float(meta["rope_base"]),
        rms_eps=float(meta["rms_eps"]),
        vocab_size=len(tensors["vocab"]),
        target_layers=tuple(int(i) for i in meta.get("target_layers", "").split(",") if i),
    )
    drafter = BlockDrafter(cfg, embedding, torch.from_numpy(tensors["vocab"].copy()))
    with torch.no_grad():
        for name, param in file_tensors(drafter).items():
            if tuple(param.shape) != tensors[name].shape:
                raise ValueError(
                    f"{path}: {name} is {tensors[name].shape}, expected {tuple(param.shape)}"
                )
            param.copy_(torch.from_numpy(tensors[name].astype(np.float32)))
    return drafter
