"""Name the target a trained drafter file fits, as the engine checks it, and ship it.

    python -m tools.drafter.stamp TRAINED.safetensors [--model GGUF] [--install]

Training (on the GPU machine, without the engine) records the target's embedding digest;
the engine checks `engine.block_drafter.target_signature` (the target's shapes and token
strings, so any quantization of the model fits). This rewrites the file's `target_check`
and `target` with the loaded model's, keeps the training digest as `target_embedding_check`,
writes the `.sha256` beside it, and with --install copies both where the engine looks
(engine/drafters/), after loading it through the engine to prove it fits.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
from pathlib import Path

from tools.drafter.safetensors_io import read_drafter_file, write_safetensors


def main(argv: list[str] | None = None) -> int:
    from engine.config import EngineConfig
    from engine.default_model import default_model_path
    from engine.drafter_file import DEFAULT_FILE, BlockDrafterWeights, target_signature
    from engine.loader import load_model

    parser = argparse.ArgumentParser(prog="python -m tools.drafter.stamp", description=__doc__)
    parser.add_argument("file", type=Path)
    parser.add_argument("--model", type=Path, default=None, help="default: the default model")
    parser.add_argument("--install", action="store_true", help=f"copy to {DEFAULT_FILE.parent}")
    args = parser.parse_args(argv)
    loaded = load_model(args.model or default_model_path(), EngineConfig(backend="numpy"))
    tensors, meta = read_drafter_file(args.file)
    signature = target_signature(loaded.config, loaded.tokenizer)
    if meta.get("target_check") != signature:
        meta = {**meta, "target_embedding_check": meta.get("target_check", "")}
    meta.update(target_check=signature, target=loaded.path.stem)
    write_safetensors(args.file, {k: v.copy() for k, v in tensors.items()}, meta)
    BlockDrafterWeights(args.file, loaded.model, signature)  # the engine takes it, or says why
    digest = hashlib.sha256(args.file.read_bytes()).hexdigest()
    sidecar = args.file.with_name(args.file.name + ".sha256")
    sidecar.write_text(f"{digest}  {args.file.name}\n", encoding="utf-8")
    print(f"{args.file}: target {meta['target']}, sha256 {digest}")
    if args.install:
        DEFAULT_FILE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.file, DEFAULT_FILE)
        DEFAULT_FILE.with_name(DEFAULT_FILE.name + ".sha256").write_text(
            f"{digest}  {DEFAULT_FILE.name}\n", encoding="utf-8"
        )
        print(f"installed as {DEFAULT_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
