"""Load a model from a GGUF file or a Hugging Face / MLX directory.

Every failure becomes a ModelLoadError that names the file and what is wrong: a
missing or truncated file, an unknown architecture, a missing or mis-shaped tensor.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any

import mlx.core as mx

from engine import device_sampling, gguf_names, models
from engine.config import EngineConfig
from engine.errors import ModelLoadError, UnsupportedArchitecture
from engine.fingerprint import DIGEST_CACHE_NAME, DigestCache, compute_key, fingerprint, weights_key
from engine.gguf_file import read_gguf_file
from engine.models.base import DecoderModel, ModelConfig, Weights
from engine.runner import ModelRunner, cpu_step
from engine.runner.runner import on_gpu
from engine.tokenizer import Tokenizer
from kernels.ops import Ops, QuantizedWeight, make_ops

Progress = Callable[[str, float], None]

# general.file_type -> the quantization label (llama.cpp's enum llama_ftype)
_GGUF_FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    21: "Q2_K_S",
    32: "BF16",
}
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


@dataclass
class LoadedModel:
    model: DecoderModel  # the pure forward
    runner: ModelRunner  # the model with its execution path: what requests run on
    tokenizer: Tokenizer
    config: ModelConfig
    path: Path
    ops: Ops
    weight_files: tuple[Path, ...]  # every file the weights and their config were read from
    digests: DigestCache = field(default_factory=lambda: DigestCache(None))
    # read-only things built for this model and shared by its sessions (a block drafter's
    # weights, by file version): a new session on the same model does not rebuild them
    built: dict[Any, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.stem if self.path.is_file() else self.path.name

    @cached_property
    def weight_bytes(self) -> int:
        """The weight files' bytes: what a forward reads, roughly (a draft model's cost)."""
        return sum(path.stat().st_size for path in self.weight_files)

    @cached_property
    def compute_path(self) -> str:
        """Backend, dtype, device and kernel path, as engine.fingerprint spells them."""
        return compute_key(self.runner)

    @cached_property
    def fingerprint(self) -> str:
        """The key a saved state must match to load here: a digest of the whole weight
        files (hashed on first use, then remembered by `digests`) and the compute path."""
        weights = weights_key(self.weight_files, self.config, self.digests)
        return fingerprint(weights, self.compute_path)


@dataclass(frozen=True)
class ModelFiles:
    """What a model file or directory holds, read but not yet built into a model."""

    family: ModuleType  # the engine.models module that builds it
    config: ModelConfig
    weights: Weights
    tokenizer: Tokenizer
    weight_files: tuple[Path, ...]  # what the weights' digest covers


def load_model(
    path: str | Path,
    config: EngineConfig | None = None,
    progress: Progress | None = None,
) -> LoadedModel:
    """The model at `path` built for `config`'s backend and dtype (None: EngineConfig())."""
    config = config or EngineConfig()
    path = Path(path).expanduser()
    report = progress or (lambda _msg, _frac: None)
    if not path.exists():
        raise ModelLoadError(path, "no such file or directory")
    report("reading weights", 0.05)
    files = _read_hf_dir(path) if path.is_dir() else read_gguf(path)
    ops = make_ops(
        config.backend,
        config.dtype,
        qmatmul=config.qmatmul,
        cpu_matmul=_cpu_matmul(config, files.config),
        kv_dtype=config.kv_dtype,
        gpu_matmul=config.gpu_matmul,
        gpu_overlap=config.gpu_overlap,
        gdn_prefill=config.gdn_prefill,
    )
    report("preparing layers", 0.5)
    model: DecoderModel = files.family.build(ops, files.config, files.weights)
    files.tokenizer.check_fits(model.config.vocab_size, path)  # ids past the embedding
    gguf_names.check_consumed(files.weights, path)
    runner = ModelRunner.for_device(model, config)
    if config.warm_up and on_gpu(ops):
        report("compiling GPU kernels", 0.65)
        device_sampling.warm_up(runner.warm_up())  # and a sampled reply's draw
    # build() may refine the config (e.g. an MLX conversion's norms already hold 1 + w)
    loaded = LoadedModel(
        model, runner, files.tokenizer, model.config, path, ops, files.weight_files
    )
    if config.prompt_cache_dir is not None:
        # the prompt cache needs the fingerprint: hash now, while progress is shown
        loaded.digests = DigestCache(Path(config.prompt_cache_dir) / DIGEST_CACHE_NAME)
        report("checking the weights", 0.8)
        try:
            _ = loaded.fingerprint
        except OSError as exc:
            raise ModelLoadError(path, f"could not read the weights ({exc})") from None
    report("ready", 1.0)
    return loaded


def _cpu_matmul(config: EngineConfig, model_config: ModelConfig) -> str | None:
    """The CPU kernel's arithmetic for this model: as asked, else int8 (the NumPy backend's
    default) only where the C step computes every row one way. Int8 activations turn a
    one-ulp difference between two paths into a different quantization step (~0.5 on a
    logit), so where rows take the per-op path (a hybrid's Gated DeltaNet layers, the C
    step switched off) float32 keeps rollback equal to a fresh prefill."""
    if config.cpu_matmul is not None:
        return config.cpu_matmul
    if not config.cpu_step or cpu_step.config_reason(model_config) is not None:
        return "float"
    return None


# -- GGUF -----------------------------------------------------------------------------


def read_gguf(path: Path) -> ModelFiles:
    """A GGUF file's family, config, weights (canonical names), tokenizer and fingerprint."""
    if path.stat().st_size < 32:
        raise ModelLoadError(path, "file is empty or too small to be a GGUF model")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ModelLoadError(path, "not a GGUF file (bad magic bytes)")
    meta, raw = read_gguf_file(path)
    arch = str(meta.get("general.architecture", ""))
    family = models.family_for_gguf(arch)
    if family is None:
        reason = models.unmapped_gguf_reason(arch) or f"unsupported GGUF architecture {arch!r}"
        raise UnsupportedArchitecture(path, reason)
    try:
        cfg = family.config_from_gguf(meta, arch)
    except (KeyError, TypeError) as exc:
        raise ModelLoadError(path, f"incomplete {arch} metadata ({exc})") from None
    except ValueError as exc:  # a switch or rope type the family refuses, named in exc
        raise ModelLoadError(path, str(exc)) from None
    rename = gguf_names.renamer(family)
    tensors, name_of = _group_quantized(raw, group_size=32, rename=rename, source=path)
    expected = gguf_names.expected_names(family, cfg.num_layers)
    name_of.update({hf: gg for gg, hf in expected.items()})
    file_type = meta.get("general.file_type")
    quant = _GGUF_FILE_TYPES.get(int(file_type.item()) if file_type is not None else -1, "mixed")
    cfg = _finish_config(cfg, tensors, quant, tie=not _has(tensors, "lm_head.weight"))
    tokenizer = Tokenizer.from_gguf_metadata(meta, path)
    weights = Weights(tensors, str(path), name_of)
    return ModelFiles(family, cfg, weights, tokenizer, (path,))


# -- Hugging Face / MLX directories -------------------------------------------------------


def _read_hf_dir(path: Path) -> ModelFiles:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(path, "no config.json in this directory (not a model directory?)")
    try:
        raw_cfg = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(config_file, f"unreadable config.json ({exc})") from None
    text_cfg = {**raw_cfg, **(raw_cfg.get("text_config") or {})}
    model_type = str(text_cfg.get("model_type") or raw_cfg.get("model_type") or "")
    if any(int(text_cfg.get(k) or 0) > 0 for k in _MOE_KEYS) or "moe" in model_type:
        raise UnsupportedArchitecture(
            config_file, f"mixture-of-experts models ({model_type}) are not supported yet"
        )
    family = models.family_for_hf(model_type)
    if family is None:
        raise UnsupportedArchitecture(config_file, f"unsupported model_type {model_type!r}")
    try:
        cfg = family.config_from_hf(text_cfg)
    except (KeyError, TypeError) as exc:
        raise ModelLoadError(config_file, f"incomplete config for {model_type} ({exc})") from None
    except ValueError as exc:  # a switch or rope type the family refuses, named in exc
        raise ModelLoadError(config_file, str(exc)) from None
    raw, weight_files = _read_safetensors(path)
    quant = raw_cfg.get("quantization") or raw_cfg.get("quantization_config") or {}
    group_size = int(quant.get("group_size", 64))
    rename = getattr(family, "canonical_name", None) or (lambda n: n)
    tensors, name_of = _group_quantized(raw, group_size=group_size, rename=rename, source=path)
    label = f"{quant['bits']}-bit" if "bits" in quant else _dtype_label(raw)
    tie = bool(text_cfg.get("tie_word_embeddings", not _has(tensors, "lm_head.weight")))
    cfg = _finish_config(cfg, tensors, label, tie=tie)
    tokenizer = Tokenizer.from_dir(path)
    weights = Weights(tensors, str(path), name_of)
    return ModelFiles(family, cfg, weights, tokenizer, (config_file, *weight_files))


def _read_safetensors(path: Path) -> tuple[dict[str, Any], list[Path]]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            raise ModelLoadError(index, f"unreadable shard index ({exc})") from None
        files = sorted({path / f for f in weight_map.values()})
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(path, "no *.safetensors weight files in this directory")
    tensors: dict[str, Any] = {}
    for file in files:
        if not file.is_file():
            raise ModelLoadError(file, "weight shard named in the index is missing")
        try:
            shard: Any = mx.load(str(file))
            tensors.update(shard)
        except Exception as exc:
            raise ModelLoadError(file, f"corrupt or truncated safetensors file ({exc})") from None
    return tensors, files


# -- shared -------------------------------------------------------------------------------


def _group_quantized(
    raw: dict[str, Any], group_size: int, rename: Callable[[str], str], source: Path
) -> tuple[dict[str, Any], dict[str, str]]:
    """Fold (weight, scales, biases) triples into QuantizedWeight under canonical names."""
    tensors: dict[str, Any] = {}
    name_of: dict[str, str] = {}
    for name, value in raw.items():
        if name.endswith((".scales", ".biases")):
            continue
        canonical = rename(name)
        if not canonical:
            continue  # a tensor the family does not use (vision tower, MTP head, ...)
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if isinstance(value, QuantizedWeight):  # a GGUF reader's, already grouped
            pass
        elif base is not None and f"{base}.scales" in raw:
            scales, biases = raw[f"{base}.scales"], raw.get(f"{base}.biases")
            if biases is None:
                raise ModelLoadError(source, f"quantized tensor {name!r} has no biases")
            in_features = int(scales.shape[-1]) * group_size
            bits = int(value.shape[-1]) * 32 // in_features
            value = QuantizedWeight(value, scales, biases, group_size, bits)
        tensors[canonical] = value
        name_of[canonical] = name
    return tensors, name_of


def _has(tensors: dict[str, Any], name: str) -> bool:
    return name in tensors


def _finish_config(cfg: ModelConfig, tensors: dict[str, Any], quant: str, tie: bool) -> ModelConfig:
    params = 0
    for t in tensors.values():
        shape = t.shape
        n = 1
        for s in shape:
            n *= int(s)
        params += n
    extra = {**cfg.extra, "num_parameters": params}
    fields = {**cfg.__dict__, "quantization": quant, "tie_word_embeddings": tie, "extra": extra}
    return ModelConfig(**fields)


def _dtype_label(raw: dict[str, Any]) -> str:
    dtypes = {str(v.dtype).replace("mlx.core.", "") for v in raw.values()}
    return "/".join(sorted(dtypes))
