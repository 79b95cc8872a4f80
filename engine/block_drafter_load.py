"""Which block drafter a loaded model drafts with, and through which pass: the file named
(or the one shipped for the model), checked against the target, its weights shared by
every session on the model, and its pass in one call where one exists (traced and, on
CUDA, one launch of the step kernel on an MLX GPU; the C step on NumPy), warmed at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from engine import block_pass_cpu, block_pass_fused
from engine.block_drafter import BlockDrafter
from engine.block_pass_fused import FusedPass
from engine.block_pass_mlx import CompiledPass
from engine.drafter_file import (
    DEFAULT_FILE,
    BlockDrafterWeights,
    check_digest,
    read_metadata,
    target_signature,
)
from engine.errors import ModelLoadError
from engine.runner.runner import on_gpu  # where a pass is overhead, traced once


def load_block_drafter(
    setting: str | None, loaded: Any, compiled: bool = False
) -> tuple[BlockDrafter | None, str]:
    """The block drafter `setting` names for `loaded` (a LoadedModel; None: the one shipped
    for the model, if any; "off": none), and why there is none ("" when it loaded);
    `compiled`: its pass traced, on an MLX GPU (on MLX's CPU a pass is bound by its
    products, not by per-operation overhead, and the traced whole block costs more), or
    on NumPy one call of the C step (engine/block_pass_cpu.py)."""
    target = loaded.model
    none = f"{loaded.name} has no block drafter; use Auto or prompt lookup."
    if setting == "off":
        return None, "the block drafter is off (BRANCHCHAT_BLOCK_DRAFTER=off)"
    path = DEFAULT_FILE if setting is None else Path(setting).expanduser()
    if setting is None and not path.is_file():
        return None, none
    try:
        meta, cfg = read_metadata(path), target.config
        if setting is None and meta.get("target_vocab", str(cfg.vocab_size)) != str(cfg.vocab_size):
            return None, none  # shipped for another model (its vocabulary says so at once)
        built = loaded.built  # what earlier sessions on this model built, by file version
        signature = built.get("target_signature") or target_signature(cfg, loaded.tokenizer)
        built["target_signature"] = signature
        if setting is None and meta and meta.get("target_check") != signature:
            return None, none
        check_digest(path)
        stat = path.stat()
        key = ("block_drafter", str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        weights = built.get(key) or BlockDrafterWeights(path, target, signature)
        built[key] = weights  # read-only: each session's drafter keeps its own rows
    except (ModelLoadError, OSError) as exc:
        return None, f"block drafter not used: {exc}"
    problem = loaded.runner.tap_problem(weights.shape.taps)
    if problem:  # its rows would come off another path, whose verifies round otherwise
        return (
            None,
            f"block drafter not used: its rows are target layers {weights.shape.taps}; {problem}",
        )
    traced, cpu, fused = None, None, None
    if compiled and on_gpu(loaded.ops):  # one pass per file version, warmed at once
        fused = built.get((*key, "fused"))
        if fused is None and block_pass_fused.unsupported_reason(weights, target) is None:
            fused = built[(*key, "fused")] = FusedPass(weights, target)
            warm_up(BlockDrafter(weights, target, fused=fused))
        traced = built.get((*key, "traced"))
        if traced is None:
            traced = built[(*key, "traced")] = CompiledPass(weights, loaded.ops)
            if fused is None:  # else it drafts only after a timed-out launch: traced then
                warm_up(BlockDrafter(weights, target, traced))
    elif compiled and block_pass_cpu.unsupported_reason(weights, loaded.ops) is None:
        cpu = built.get((*key, "cpu")) or block_pass_cpu.CpuPass(weights, loaded.ops)
        built[(*key, "cpu")] = cpu
    return BlockDrafter(weights, target, traced or False, cpu, fused), ""


def warm_up(drafter: BlockDrafter) -> None:
    """A greedy and a sampled draft over a short made-up context, then the drafter left
    empty: a traced pass's trace and the GPU's kernel builds happen at load, not inside
    someone's first reply. The one-launch pass runs k + 1 rows, and its top-1 is traced
    per row count: a greedy draft of every k."""
    rows = 8
    drafter.begin([0] * rows)
    drafter.observe_hidden(np.zeros((rows, drafter.w.shape.capture_width), np.float32), 0)
    for k in range(1, drafter.max_draft + 1) if drafter.fused is not None else [drafter.max_draft]:
        drafter.propose(0, k)
    drafter.couple(lambda row, history: int(np.argmax(row)))
    drafter.propose(0, drafter.max_draft)
    drafter.begin([])
