"""python -m bench <name> [options]: run one benchmark; each prints figures and writes JSON.

The edge of the bench: the engine configuration (the BRANCHCHAT_* variables) is built
here, applied to the process before any benchmark module loads NumPy, and handed to the
chosen benchmark's main(argv, config), whose --backend flag takes precedence over it.
"""

from __future__ import annotations

import importlib
import sys

from engine.config import EngineConfig, configure_process

# subcommand name -> module (imported only when chosen) whose main(argv) runs it
COMMANDS = {
    "agreement": "bench.agreement",
    "app_stream": "bench.app_stream",
    "attention": "bench.attention",
    "auto_host": "bench.auto_host",
    "decode": "bench.decode",
    "edit": "bench.edit",
    "matmul": "bench.matmul",
    "plots": "bench.plots",
    "priced": "bench.priced",
    "remote": "bench.remote",
    "rollback": "bench.rollback",
    "sampling": "bench.sampling",
    "shapes": "bench.shapes",
    "speculative": "bench.speculative",
    "verify": "bench.verify",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        names = ", ".join(sorted(COMMANDS))
        print(f"usage: python -m bench {{{names}}} [options]", file=sys.stderr)
        return 2
    try:
        config = EngineConfig.from_environment()
    except ValueError as exc:  # a malformed BRANCHCHAT_* variable
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_process(config)
    module = importlib.import_module(COMMANDS[argv[0]])
    return int(module.main(argv[1:], config) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
