"""Regenerate tests/oracles/fixtures/ (README.md says how, and with which versions).

Needs torch, transformers, gguf and llama-cpp-python, and the llama.cpp tree of the same
llama-cpp-python version (for convert_hf_to_gguf.py); the suite itself only reads the
files this writes. Not collected by pytest (not a test_*.py file).

    python -m tests.oracles.make_fixtures --llama-cpp DIR [--only NAME ...] [--real | --tiny]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
NEEDED = ("torch", "transformers", "gguf", "llama_cpp", "safetensors")


def main() -> int:
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"make_fixtures needs {', '.join(missing)}: run it in the reference venv "
            "(tests/oracles/README.md); the suite only reads the committed fixtures.",
            file=sys.stderr,
        )
        return 2
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--llama-cpp",
        type=Path,
        required=True,
        help="the vendor/llama.cpp folder of the llama-cpp-python sdist",
    )
    parser.add_argument("--only", nargs="*", default=[], help="tiny case or real model names")
    part = parser.add_mutually_exclusive_group()
    part.add_argument("--tiny", action="store_true", help="only the tiny checkpoints")
    part.add_argument("--real", action="store_true", help="only the two real models")
    args = parser.parse_args()
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        parser.error(f"{args.llama_cpp} holds no convert_hf_to_gguf.py")

    import torch

    from tests.oracles import make_real, make_tiny

    torch.set_num_threads(2)
    manifest_path = FIXTURES / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest.setdefault("cases", {})
    manifest.setdefault("real_models", {})
    manifest["versions"] = make_real.versions()
    only = set(args.only)
    with tempfile.TemporaryDirectory(prefix="oracles-") as work:
        if not args.real:
            manifest["cases"].update(
                make_tiny.write_all(FIXTURES, args.llama_cpp, Path(work), only)
            )
        if not args.tiny:
            manifest["real_models"].update(make_real.write_all(FIXTURES, only))
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
