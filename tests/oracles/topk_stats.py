"""Comparing full logits with a reference kept as its top-k per position.

Full logits of a 262k vocabulary over 1,000 positions are too large to commit, so each
reference keeps, per position, its argmax, its log-sum-exp and its top-k ids with their
logits. The KL divergence from that reference P to a candidate Q is taken over P's
top-k with everything else lumped into one outcome:

    KL = sum_{i in top-k} p_i (log p_i - log q_i) + p_rest (log p_rest - log q_rest)

where p_rest = 1 - sum p_i and q_rest = 1 - sum q_i over the same ids. Merging outcomes
never raises a KL (the log-sum inequality), so this is a lower bound of the full KL,
equal to it when the rest carries no mass; a candidate and llama.cpp are measured on the
same partition, so their figures compare. Top-1 agreement is argmax equality.
"""

from __future__ import annotations

from typing import Any

import numpy as np

TOP_K = 64


def log_sum_exp(logits: np.ndarray) -> np.ndarray:
    """Per row, float64: (N, V) -> (N,)."""
    x = np.asarray(logits, dtype=np.float64)
    peak = x.max(axis=-1, keepdims=True)
    return (peak + np.log(np.exp(x - peak).sum(axis=-1, keepdims=True)))[:, 0]


def summarize(logits: np.ndarray, k: int = TOP_K) -> dict[str, np.ndarray]:
    """argmax, lse and top-k (ids by falling logit, logits as float32) of (N, V) logits."""
    x = np.asarray(logits)
    top = np.argpartition(-x, k, axis=-1)[:, :k]
    order = np.argsort(-np.take_along_axis(x, top, axis=-1), axis=-1, kind="stable")
    top = np.take_along_axis(top, order, axis=-1)
    return {
        "argmax": x.argmax(axis=-1).astype(np.int32),
        "lse": log_sum_exp(x),
        "top_ids": top.astype(np.int32),
        "top_logits": np.take_along_axis(x, top, axis=-1).astype(np.float32),
    }


def lumped_kl(
    ref_top_logits: np.ndarray,
    ref_lse: np.ndarray,
    cand_at_ref_top: np.ndarray,
    cand_lse: np.ndarray,
) -> np.ndarray:
    """Per-position KL(P || Q) over P's top-k plus the lumped rest (module docstring).

    ref_top_logits, cand_at_ref_top: (N, k), the logits of P and of Q at P's top-k ids;
    ref_lse, cand_lse: (N,), each distribution's log-sum-exp over the whole vocabulary.
    """
    log_p = np.asarray(ref_top_logits, np.float64) - np.asarray(ref_lse, np.float64)[:, None]
    log_q = np.asarray(cand_at_ref_top, np.float64) - np.asarray(cand_lse, np.float64)[:, None]
    p = np.exp(log_p)
    p_rest = np.clip(1.0 - p.sum(axis=-1), 0.0, 1.0)
    q_rest = np.clip(1.0 - np.exp(log_q).sum(axis=-1), 1e-300, 1.0)
    rest = np.where(p_rest > 0, p_rest * (np.log(np.maximum(p_rest, 1e-300)) - np.log(q_rest)), 0.0)
    return (p * (log_p - log_q)).sum(axis=-1) + rest


def full_kl(ref_logits: np.ndarray, cand_logits: np.ndarray) -> np.ndarray:
    """Per-position KL(P || Q) over the whole vocabulary, float64: (N, V) x2 -> (N,)."""
    log_p = np.asarray(ref_logits, np.float64) - log_sum_exp(ref_logits)[:, None]
    log_q = np.asarray(cand_logits, np.float64) - log_sum_exp(cand_logits)[:, None]
    return (np.exp(log_p) * (log_p - log_q)).sum(axis=-1)


def teacher_forced(runner: Any, ids: list[int], ref_top: np.ndarray, rows: int) -> dict:
    """One forward over `ids` in chunks of `rows`: per position our argmax, log-sum-exp and
    logits at the reference's top-k ids (what `figures` compares)."""
    argmax, lse, at_top = [], [], []
    state = runner.new_state()
    for start in range(0, len(ids), rows):
        out = runner.forward(ids[start : start + rows], state, logits="all")
        logits = np.asarray(runner.ops.to_numpy(out), dtype=np.float32)
        logits = logits.reshape(-1, runner.config.vocab_size)  # [rows, vocab]
        argmax.append(logits.argmax(axis=-1))
        lse.append(log_sum_exp(logits))
        at_top.append(np.take_along_axis(logits, ref_top[start : start + len(logits)], axis=-1))
    return {
        "argmax": np.concatenate(argmax),
        "lse": np.concatenate(lse),
        "at_ref_top": np.concatenate(at_top),
    }


def figures(ref: dict, argmax: np.ndarray, lse: np.ndarray, at_ref_top: np.ndarray) -> dict:
    """Top-1 agreement with float64 and with llama.cpp, and the lumped KL to float64."""
    kl = lumped_kl(ref["f64_top_logits"], ref["f64_lse"], at_ref_top, lse)
    return {
        "top1_vs_f64": float(np.mean(argmax == ref["f64_argmax"])),
        "top1_vs_llama_cpp": float(np.mean(argmax == ref["llama_cpp_argmax"])),
        "mean_kl_vs_f64": float(kl.mean()),
        "p99_kl_vs_f64": float(np.quantile(kl, 0.99)),
    }
