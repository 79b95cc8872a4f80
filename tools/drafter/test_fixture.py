"""The engine's fixture (tests/fixtures/block_drafter) against a NumPy float64 forward
written from the spec alone, not from model.py: the torch drafter, the file layout and the
stored reference all agree with the contract the engine implements."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tools.drafter.gguf_target import GGUFFile, embedding_check
from tools.drafter.safetensors_io import read_drafter_file

FIXTURE = Path(__file__).resolve().parents[2] / "tests/fixtures/block_drafter"
MODEL = Path.home() / ".cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = pytest.mark.skipif(not MODEL.exists(), reason="the default model is not fetched")


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, base):  # x [L, heads, hd], rotate-half
    half = x.shape[-1] // 2
    ang = pos[:, None] * base ** (-np.arange(half) / half)  # [L, half]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    return np.concatenate([x[..., :half] * cos - x[..., half:] * sin,
                           x[..., half:] * cos + x[..., :half] * sin], -1)  # fmt: skip


def spec_forward(t, meta, E, h, pending, rows):
    """Logits [rows - 1, N] of one draft pass, straight from the format's text (docs/DESIGN.md)."""
    eps, base = float(meta["rms_eps"]), float(meta["rope_base"])
    H, KV, hd = int(meta["heads"]), int(meta["kv_heads"]), int(meta["head_dim"])
    w = {k: v.astype(np.float64) for k, v in t.items() if k != "vocab"}
    P = len(h)
    c = _rms(h @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    x = np.stack([E[pending]] + [w["mask_embedding"]] * (rows - 1))
    ctx_pos, blk_pos = np.arange(P, dtype=np.float64), np.arange(P, P + rows, dtype=np.float64)
    for i in range(int(meta["layers"])):
        layer = {n.split(".")[2]: v for n, v in w.items() if n.startswith(f"layers.{i}.")}
        g = layer.__getitem__
        kc = _rope((c @ g("k_proj").T).reshape(P, KV, hd), ctx_pos, base)
        vc = (c @ g("v_proj").T).reshape(P, KV, hd)
        a = _rms(x, g("input_norm"), eps)
        q = _rope((a @ g("q_proj").T).reshape(rows, H, hd), blk_pos, base)
        kb = _rope((a @ g("k_proj").T).reshape(rows, KV, hd), blk_pos, base)
        vb = (a @ g("v_proj").T).reshape(rows, KV, hd)
        k, v = np.concatenate([kc, kb]), np.concatenate([vc, vb])  # [P + rows, KV, hd]
        out = np.zeros((rows, H, hd))
        for j in range(rows):
            for head in range(H):
                kv = head // (H // KV)
                keys, vals = k[: P + j + 1, kv], v[: P + j + 1, kv]
                s = keys @ q[j, head] / np.sqrt(hd)
                p = np.exp(s - s.max())
                out[j, head] = (p / p.sum()) @ vals
        x = x + out.reshape(rows, H * hd) @ g("o_proj").T
        b = _rms(x, g("post_norm"), eps)
        gate = b @ g("gate_proj").T
        x = x + ((gate / (1 + np.exp(-gate))) * (b @ g("up_proj").T)) @ g("down_proj").T
    head = E[t["vocab"]]
    return _rms(x[1:], w["final_norm.weight"], eps) @ head.T


def test_fixture_matches_the_spec():
    tensors, meta = read_drafter_file(FIXTURE / "drafter.safetensors")
    inputs = np.load(FIXTURE / "inputs.npz")
    E32 = GGUFFile(MODEL).tensor("token_embd.weight")
    assert meta["target_check"] == embedding_check(E32)
    E = E32.astype(np.float64)
    h, pending = inputs["captures"].astype(np.float64), int(inputs["pending"])
    full = spec_forward(tensors, meta, E, h, pending, int(inputs["block"]))
    short = spec_forward(tensors, meta, E, h, pending, int(inputs["short_rows"]))
    scale = np.abs(full).max()
    np.testing.assert_allclose(inputs["logits"], full, rtol=0, atol=2e-7 * scale)
    np.testing.assert_allclose(inputs["short_logits"], short, rtol=0, atol=2e-7 * scale)
    np.testing.assert_array_equal(inputs["draft_tokens"], tensors["vocab"][full.argmax(-1)])
    assert (
        tensors["fc.weight"].dtype == np.float16
        and tensors["final_norm.weight"].dtype == np.float32
    )
