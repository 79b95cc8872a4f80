"""The real models' fixtures: text.txt tokenized by llama.cpp, llama.cpp's logits at every
position, and transformers' float64 forward of the same GGUF (its GGUF loader dequantizes
with gguf-py), each kept as per-position top-k summaries (topk_stats.py). Runs only in the
reference venv (see README.md).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from tests.oracles import llama_cpp_tools, topk_stats

TEXT = Path(__file__).parent / "text.txt"
NUM_TOKENS = 1000  # the text's first 1,000 tokens (both tokenizers make ~1,170 of it)
_MODELS_DIR = Path("~/.cache/branchchat/models").expanduser()
REAL_MODELS = {
    # name -> (the GGUF, where to find it unless an environment variable names another)
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", "ORACLE_SMOLLM2_GGUF"),
    "gemma3_270m": ("gemma-3-270m-q4_k_m.gguf", "ORACLE_GEMMA3_GGUF"),
}


def model_path(name: str) -> Path:
    file_name, variable = REAL_MODELS[name]
    return Path(os.environ.get(variable, _MODELS_DIR / file_name))


def versions() -> dict[str, str]:
    import gguf
    import llama_cpp
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": getattr(gguf, "__version__", "") or _dist_version("gguf"),
        "llama_cpp_python": llama_cpp.__version__,
        "accelerate": _dist_version("accelerate"),
    }


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def hf_float64_logits(path: Path, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    # dequantize: without it transformers may keep K-quant blocks packed and run float32
    # matmul kernels on them, which would make this no float64 reference
    model = AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        dtype=torch.float64,
        attn_implementation="eager",
        quantization_config=GgufConfig(gguf_file=path.name, dequantize=True),
    ).eval()
    not_float64 = {str(p.dtype) for p in model.parameters()} - {"torch.float64"}
    if not_float64:
        raise RuntimeError(f"{path.name}: transformers kept parameters in {not_float64}")
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
    del model
    return logits


def write_model(name: str, fixtures: Path) -> dict:
    path = model_path(name)
    ids = llama_cpp_tools.tokenize(path, TEXT.read_text(encoding="utf-8"))[:NUM_TOKENS]
    print(f"real: {name}: {len(ids)} tokens", flush=True)
    llama = llama_cpp_tools.logits(path, ids, n_ctx=len(ids))
    ours = topk_stats.summarize(llama)
    exact = hf_float64_logits(path, ids)
    ref = topk_stats.summarize(exact)
    llama_at_ref = np.take_along_axis(llama, ref["top_ids"], axis=-1)
    full_kl = topk_stats.full_kl(exact, llama)
    del exact, llama
    lumped = topk_stats.lumped_kl(ref["top_logits"], ref["lse"], llama_at_ref, ours["lse"])
    out = fixtures / "real" / f"{name}.npz"
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        ids=np.array(ids, dtype=np.int32),
        **{f"f64_{k}": v for k, v in ref.items()},
        **{f"llama_cpp_{k}": v for k, v in ours.items()},
        llama_cpp_at_f64_top=llama_at_ref.astype(np.float32),
        llama_cpp_full_kl=full_kl,
    )
    return {
        "model_file": path.name,
        "sha256": sha256(path),
        "num_tokens": len(ids),
        "llama_cpp_top1_vs_f64": float(np.mean(ours["argmax"] == ref["argmax"])),
        "llama_cpp_mean_kl_vs_f64_lumped": float(lumped.mean()),
        "llama_cpp_mean_kl_vs_f64_full": float(full_kl.mean()),
    }


def write_all(fixtures: Path, only: set[str]) -> dict[str, dict]:
    entries = {}
    for name in REAL_MODELS:
        if only and name not in only:
            continue
        if not model_path(name).is_file():
            print(f"real: {name}: {model_path(name)} is absent, skipped")
            continue
        entries[name] = write_model(name, fixtures)
    return entries
