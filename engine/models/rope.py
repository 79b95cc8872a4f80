"""Rotary position embeddings and their scalings, with Hugging Face transformers' semantics
(modeling_rope_utils.py, v5: each rope type gives inverse frequencies and an attention factor
that multiplies cos and sin).

- default: inv_freq_i = theta^(-2i/d) (Su et al., RoFormer, arXiv:2104.09864).
- linear: inv_freq / factor (position interpolation, Chen et al. 2023, arXiv:2306.15595).
- dynamic (NTK): equals default up to `max_position_embeddings`; past it HF recomputes the
  frequencies for the whole sequence, which rows already in the KV cache cannot follow, so the
  engine refuses positions past it (the context never grows past it anyway).
- yarn: a per-frequency ramp between interpolated and extrapolated frequencies, and the
  attention factor 0.1 ln(factor) + 1 (Peng et al., arXiv:2309.00071).
- llama3: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
- GGUF: llama.cpp's `rope_freqs` tensor divides the frequencies (Llama 3.x files carry the
  llama3 scaling this way), and `rope.scaling.type` linear / yarn.

Any other rope type, or a parameter of one that is not implemented, is refused naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.ops import Array, Ops

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
_KNOWN_KEYS = {
    "default": {"rope_theta", "partial_rotary_factor"},
    "linear": {"factor"},
    "dynamic": {"factor", "original_max_position_embeddings"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "attention_factor",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
}


@dataclass(frozen=True)
class RopeScaling:
    """One rope scaling as a config states it (HF `rope_scaling` / `rope_parameters`)."""

    rope_type: str = "default"
    factor: float = 1.0
    original_max_positions: int = 0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {self.rope_type!r} is not supported")
        if self.factor <= 0:
            raise ValueError(f"rope scaling factor must be positive, not {self.factor}")


def parse_hf(cfg: dict[str, Any], scaling: dict[str, Any] | None) -> RopeScaling | None:
    """The scaling of an HF rope dict (None or rope_type "default": plain rope)."""
    if not scaling:
        return None
    rope_type = str(scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported (supported: {ROPE_TYPES})")
    if rope_type == "default":
        return None
    unknown = sorted(set(scaling) - _KNOWN_KEYS[rope_type] - _KNOWN_KEYS["default"] - {"type"})
    unknown = [k for k in unknown if k != "rope_type" and scaling[k] is not None]
    if unknown:
        raise ValueError(f"rope_type {rope_type!r} parameter(s) {unknown} are not supported")
    max_positions = int(cfg.get("max_position_embeddings") or 0)
    original = int(
        cfg.get("original_max_position_embeddings")  # Phi-3 style: outside the rope dict
        or scaling.get("original_max_position_embeddings")
        or max_positions
    )
    factor = scaling.get("factor")
    if factor is None and rope_type == "yarn" and original:
        factor = max_positions / original  # HF v5: DeepSeek-V3 states only the two lengths
    if factor is None:
        raise ValueError(f"rope_type {rope_type!r} needs a factor")
    if rope_type == "dynamic":
        original = max_positions  # HF compares with max_position_embeddings itself
    return RopeScaling(
        rope_type=rope_type,
        factor=float(factor),
        original_max_positions=original,
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        beta_fast=float(scaling.get("beta_fast") or 32.0),
        beta_slow=float(scaling.get("beta_slow") or 1.0),
        attention_factor=_optional_float(scaling.get("attention_factor")),
        mscale=float(scaling.get("mscale") or 0.0),
        mscale_all_dim=float(scaling.get("mscale_all_dim") or 0.0),
        truncate=bool(scaling.get("truncate", True)),
    )


def parse_gguf(get: Any) -> RopeScaling | None:
    """llama.cpp's `{arch}.rope.scaling.*` keys (`get(key, default)` reads one)."""
    kind = str(get("rope.scaling.type", "none") or "none")
    factor = float(get("rope.scaling.factor", 0.0) or 0.0)
    linear = float(get("rope.scale_linear", 0.0) or 0.0)  # older converters
    if kind == "none" and linear and linear != 1.0:
        kind, factor = "linear", linear
    if kind == "none" or (kind == "linear" and factor in (0.0, 1.0)):
        return None
    if kind not in ("linear", "yarn"):
        raise ValueError(f"GGUF rope.scaling.type {kind!r} is not supported")
    for key in ("yarn_log_multiplier", "yarn_ext_factor", "yarn_attn_factor", "attn_factor"):
        if get(f"rope.scaling.{key}", None) is not None:
            raise ValueError(f"GGUF rope.scaling.{key} is not supported")
    return RopeScaling(
        rope_type=kind,
        factor=factor,
        original_max_positions=int(get("rope.scaling.original_context_length", 0) or 0),
        beta_fast=float(get("rope.scaling.yarn_beta_fast", 32.0) or 32.0),
        beta_slow=float(get("rope.scaling.yarn_beta_slow", 1.0) or 1.0),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def frequencies(dims: int, theta: float, scaling: RopeScaling | None) -> tuple[np.ndarray, float]:
    """(inv_freq [dims/2] float64, attention factor) of a rope over `dims` features."""
    exponents = np.arange(0, dims, 2, dtype=np.float64) / dims
    inv_freq = theta**-exponents
    if scaling is None or scaling.rope_type in ("default", "dynamic"):
        return inv_freq, 1.0
    factor = scaling.factor
    if scaling.rope_type == "linear":
        return inv_freq / factor, 1.0
    if scaling.rope_type == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    return _yarn(dims, theta, inv_freq, scaling)


def _llama3(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    old_len = s.original_max_positions
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled)


def _yarn(
    dims: int, theta: float, inv_freq: np.ndarray, s: RopeScaling
) -> tuple[np.ndarray, float]:
    factor = s.factor
    if s.attention_factor is not None:
        attention_factor = s.attention_factor
    elif s.mscale and s.mscale_all_dim:
        attention_factor = _mscale(factor, s.mscale) / _mscale(factor, s.mscale_all_dim)
    else:
        attention_factor = _mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        ratio = s.original_max_positions / (num_rotations * 2 * math.pi)
        return dims * math.log(ratio) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001  # HF: prevent a singular ramp
    ramp = np.clip((np.arange(dims // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1: keep the frequency, 0: interpolate it by `factor`
    mixed = inv_freq / factor * (1 - extrapolation) + inv_freq * extrapolation
    return mixed, float(attention_factor)


class Rope:
    """One attention layer's rope: the frequency table, the attention factor, and the
    positions it may serve (dynamic NTK: up to `max_position_embeddings`)."""

    def __init__(
        self,
        dims: int,
        theta: float,
        traditional: bool,
        scaling: RopeScaling | None = None,
        freq_factors: np.ndarray | None = None,
    ) -> None:
        self.dims, self.theta, self.traditional = dims, theta, traditional
        inv_freq, self.mscale = frequencies(dims, theta, scaling)
        if freq_factors is not None:  # llama.cpp's rope_freqs: theta_i / factor_i
            inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)
        plain = scaling is None or scaling.rope_type in ("default", "dynamic")
        self.is_plain = plain and freq_factors is None
        self.inv_freq: np.ndarray | None = None if self.is_plain else inv_freq
        dynamic = scaling is not None and scaling.rope_type == "dynamic"
        self.max_positions = scaling.original_max_positions if dynamic and scaling else 0

    def __call__(self, ops: Ops, x: Array, offset: int) -> Array:
        end = offset + int(x.shape[1])
        if self.max_positions and end > self.max_positions:
            raise ValueError(
                f"rope_type 'dynamic' past {self.max_positions} positions recomputes every "
                "earlier position's rotation, which cached keys cannot follow; refused"
            )
        return ops.rope(
            x, offset, self.dims, self.theta, self.traditional, self.inv_freq, self.mscale
        )
