"""llama.cpp's side of the fixtures: its converter, its quantizer and its logits.

Runs only in the reference venv (llama-cpp-python, and the llama.cpp tree from the same
version's sdist for convert_hf_to_gguf.py and its gguf-py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

# llama.cpp's llama_ftype values (include/llama.h)
FTYPES = {"F32": 0, "F16": 1, "Q8_0": 7, "Q4_K_M": 15, "Q6_K": 18}

# The tiny tokenizer's pre-tokenizer (digits one by one, then GPT-2's byte-level split) is
# SmolLM's; the converter recognises pre-tokenizers by hashing a test string's tokens, and
# a 320-token vocabulary hashes to nothing it knows, so the converter is told the name.
_CONVERT = """
import sys
sys.path.insert(0, {root!r})
sys.argv = ["convert_hf_to_gguf.py", *{args!r}]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def convert(llama_cpp_root: Path, hf_dir: Path, out: Path, flags: tuple[str, ...] = ()) -> None:
    """llama.cpp's convert_hf_to_gguf.py on `hf_dir` (float32 out), with its own gguf-py."""
    args = [str(hf_dir), "--outfile", str(out), "--outtype", "f32", *flags]
    code = _CONVERT.format(root=str(llama_cpp_root), args=args)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"convert_hf_to_gguf failed on {hf_dir}:\n{done.stderr[-3000:]}")


def quantize(src: Path, dst: Path, qtype: str) -> None:
    """llama.cpp's own quantizer (llama_model_quantize), as llama-quantize runs it."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[qtype]
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({qtype}) failed on {src}: {rc}")


def logits(gguf_path: Path, ids: list[int], n_ctx: int | None = None) -> np.ndarray:
    """llama.cpp's float32 logits at every position of `ids`, one pass, CPU."""
    import llama_cpp

    n_ctx = n_ctx or max(64, len(ids))
    llm = llama_cpp.Llama(
        str(gguf_path),
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        logits_all=True,
        n_threads=2,
        verbose=False,
        n_gpu_layers=0,
    )
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    return out


def tokenize(gguf_path: Path, text: str) -> list[int]:
    """llama.cpp's tokens for `text`, with the BOS the model's metadata asks for."""
    import llama_cpp

    llm = llama_cpp.Llama(str(gguf_path), n_ctx=64, vocab_only=True, verbose=False)
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)
    llm.close()
    return [int(i) for i in ids]
