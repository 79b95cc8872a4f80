"""The tiny checkpoints' fixtures: transformers writes each checkpoint and its float32
logits; llama.cpp converts and quantizes it; transformers runs each GGUF's dequantized
weights. Runs only in the reference venv (see README.md).

Which GGUF element came from which checkpoint element is learnt, not re-implemented: a
twin checkpoint whose every matrix element holds its own flat index goes through the
same converter, so each element of its GGUF names its source (the converter only moves
matrix elements: llama's q/k row permutation, Qwen3.5's head reorders, conv1d squeezes).
1-D tensors (norms, which the converter may shift by 1, and A_log) are never quantized,
so they are checked equal to the F32 file's and taken from the checkpoint.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tests.oracles import llama_cpp_tools
from tests.oracles.oracle_cases import CASES, SEED, SEQUENCE_LENGTHS, TinyCase
from tests.tiny_tokenizer import VOCAB_SIZE, write_hf_tokenizer


def token_sequences() -> list[list[int]]:
    rng = np.random.default_rng(SEED)
    return [[int(t) for t in rng.integers(0, VOCAB_SIZE, n)] for n in SEQUENCE_LENGTHS]


def build_model(case: TinyCase) -> torch.nn.Module:
    fields = dict(case.config)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.architectures = case.config["architectures"]
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.to(torch.float32).eval()


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights of O(1) activations and logits of a few units: matrices N(0, 1/fan_in),
    embeddings N(0, 1/16), vectors their initial value (ones, zeros, A_log's draw) plus
    N(0, 0.1^2)."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
        if param.ndim == 1:
            param.add_(0.1 * noise)
        elif "embed_tokens" in name:
            param.copy_(0.25 * noise)
        else:
            param.copy_(noise / param.shape[-1] ** 0.5)
    for layer in getattr(getattr(model, "model", None), "layers", []):
        if (mixer := getattr(layer, "linear_attn", None)) is not None:
            condition_gated_delta(mixer, gen)


@torch.no_grad()
def condition_gated_delta(mixer: torch.nn.Module, gen: torch.Generator) -> None:
    """Gated DeltaNet outputs of O(0.1), well above the gated norm's sqrt(eps) = 1e-3: with
    A_log's own (unseeded) draw, A up to 16, each token is forgotten at once and outputs near
    1e-3 turn float32 rounding into 1e-4 logit differences (transformers' own float32 was
    1.4e-4 from its float64). A slow decay (A in 0.05..0.5) and 4 times larger v rows."""
    A = 0.05 + 0.45 * torch.rand(mixer.A_log.shape, generator=gen)
    mixer.A_log.copy_(torch.log(A))
    mixer.in_proj_qkv.weight[2 * mixer.key_dim :] *= 4.0


@torch.no_grad()
def forward_logits(model: torch.nn.Module, sequences: list[list[int]]) -> list[np.ndarray]:
    return [model(torch.tensor([ids])).logits[0].double().numpy() for ids in sequences]


def save_checkpoint(model: torch.nn.Module, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    write_hf_tokenizer(directory)


# -- from a GGUF's elements back to the checkpoint's ------------------------------------


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """Tied state names (lm_head.weight when it is embed_tokens.weight) -> the original."""
    state = model.state_dict()
    firsts: dict[int, str] = {}
    tied = {}
    for name, tensor in state.items():
        first = firsts.setdefault(tensor.data_ptr(), name)
        if first != name:
            tied[name] = first
    return tied


def _distinct_matrices(state: dict, tied: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    return [n for n, t in state.items() if t.ndim >= 2 and n not in tied], tied


class ElementMap:
    """For each GGUF matrix, the checkpoint tensor and flat position of every element."""

    def __init__(
        self, state: dict[str, torch.Tensor], tied: dict[str, str], index_gguf: Path
    ) -> None:
        self.names, self.aliases = _distinct_matrices(state, tied)
        sizes = [state[n].numel() for n in self.names]
        self.offsets = np.cumsum([0, *sizes])
        if self.offsets[-1] >= 2**24:
            raise ValueError("too many matrix elements for exact float32 indices")
        self.shapes = {n: tuple(state[n].shape) for n in self.names}
        self.sources: dict[str, np.ndarray] = {}
        for tensor in gguf.GGUFReader(index_gguf).tensors:
            data = np.asarray(tensor.data, dtype=np.float32)
            if data.ndim >= 2:
                flat = data.ravel().astype(np.int64)
                if not np.array_equal(flat.astype(np.float32), data.ravel()):
                    raise ValueError(f"{tensor.name}: the converter changed matrix values")
                self.sources[tensor.name] = flat
        covered = np.sort(np.concatenate(list(self.sources.values())))
        if not np.array_equal(covered, np.arange(self.offsets[-1])):
            raise ValueError("the GGUF's matrices do not hold every checkpoint element once")

    @staticmethod
    def index_state(
        state: dict[str, torch.Tensor], tied: dict[str, str]
    ) -> dict[str, torch.Tensor]:
        """The twin checkpoint: matrix elements numbered in order, vectors as they are."""
        names, aliases = _distinct_matrices(state, tied)
        out, start = {k: v.clone() for k, v in state.items()}, 0
        for name in names:
            n = state[name].numel()
            out[name] = torch.arange(start, start + n, dtype=torch.float32).reshape(
                state[name].shape
            )
            start += n
        out.update({alias: out[name] for alias, name in aliases.items()})
        return out

    def to_state(self, gguf_path: Path, f32_gguf: Path, state: dict[str, torch.Tensor]) -> dict:
        """The checkpoint's state with every matrix replaced by this GGUF's dequantized one."""
        flat = np.zeros(self.offsets[-1], dtype=np.float32)
        f32_vectors = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(f32_gguf).tensors}
        for tensor in gguf.GGUFReader(gguf_path).tensors:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            if tensor.name in self.sources:
                flat[self.sources[tensor.name]] = values.ravel()
            elif not np.array_equal(values, f32_vectors[tensor.name]):
                raise ValueError(f"{gguf_path.name}: {tensor.name} is not the F32 file's")
        out = dict(state)
        for name, lo, hi in zip(self.names, self.offsets[:-1], self.offsets[1:], strict=True):
            out[name] = torch.from_numpy(flat[lo:hi].reshape(self.shapes[name]).copy())
        out.update({alias: out[name] for alias, name in self.aliases.items()})
        return out


def tensor_types(path: Path) -> dict[str, int]:
    return dict(Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors))


def write_ggufs(
    case: TinyCase,
    model: torch.nn.Module,
    hf_dir: Path,
    out_dir: Path,
    llama_root: Path,
    work: Path,
) -> dict:
    """Each of the case's GGUF types, its HF-dequantized and llama.cpp logits."""
    tied = tied_names(model)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    twin_dir = work / f"{case.name}-index"
    model.load_state_dict(ElementMap.index_state(state, tied))
    save_checkpoint(model, twin_dir)
    model.load_state_dict(state)
    llama_cpp_tools.convert(
        llama_root, twin_dir, work / f"{case.name}-index.gguf", case.convert_flags
    )
    f32 = work / f"{case.name}-F32.gguf"
    llama_cpp_tools.convert(llama_root, hf_dir, f32, case.convert_flags)
    elements = ElementMap(state, tied, work / f"{case.name}-index.gguf")
    if any(not torch.equal(v, state[k]) for k, v in elements.to_state(f32, f32, state).items()):
        raise ValueError(f"{case.name}: the element map does not rebuild the checkpoint")
    sequences = token_sequences()
    report = {}
    for qtype in case.gguf_types:
        path = out_dir / f"{qtype}.gguf"
        if qtype == "F32":
            shutil.copyfile(f32, path)
        else:
            llama_cpp_tools.quantize(f32, path, qtype)
        model.load_state_dict(elements.to_state(path, f32, state))
        hf = forward_logits(model, sequences)
        ours = [llama_cpp_tools.logits(path, ids) for ids in sequences]
        np.savez_compressed(
            out_dir / f"{qtype}.npz",
            **{f"hf_{i}": h.astype(np.float32) for i, h in enumerate(hf)},
            **{f"llama_cpp_{i}": c for i, c in enumerate(ours)},
        )
        report[qtype] = {
            "file": f"{case.name}/{qtype}.gguf",
            "tensor_types": tensor_types(path),
            "llama_cpp_max_abs_diff": max(
                float(np.abs(c - h).max()) for c, h in zip(ours, hf, strict=True)
            ),
        }
    model.load_state_dict(state)
    return report


def write_case(
    case: TinyCase, fixtures: Path, llama_root: Path, work: Path, owners: dict[str, dict]
) -> dict:
    out_dir = fixtures / case.name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    model = build_model(case)
    if case.weights_from:
        model.load_state_dict(owners[case.weights_from])
    else:
        randomize(model, SEED)
        owners[case.name] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    hf_dir = work / case.name
    save_checkpoint(model, hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if not case.weights_from:
        shutil.copyfile(hf_dir / "model.safetensors", out_dir / "model.safetensors")
    sequences = token_sequences()
    logits = forward_logits(model, sequences)
    np.savez_compressed(
        out_dir / "reference.npz",
        **{f"ids_{i}": np.array(ids, dtype=np.int32) for i, ids in enumerate(sequences)},
        **{f"logits_{i}": x.astype(np.float32) for i, x in enumerate(logits)},
    )
    entry = {
        "weights_from": case.weights_owner,
        "notes": case.notes,
        "num_sequences": len(sequences),
        "ggufs": {},
    }
    if case.gguf_types:
        entry["ggufs"] = write_ggufs(case, model, hf_dir, out_dir, llama_root, work)
    return entry


def write_all(fixtures: Path, llama_root: Path, work: Path, only: set[str]) -> dict[str, dict]:
    owners: dict[str, dict] = {}
    entries = {}
    for case in CASES:
        if only and case.name not in only and case.weights_owner not in only:
            continue
        if case.weights_from and case.weights_from not in owners:
            owner = next(c for c in CASES if c.name == case.weights_from)
            model = build_model(owner)
            randomize(model, SEED)
            owners[owner.name] = model.state_dict()
        print(f"tiny: {case.name}", flush=True)
        entries[case.name] = write_case(case, fixtures, llama_root, work, owners)
    return entries
