"""python -m bench <name> [options]: run one benchmark; each prints figures and writes JSON."""

from __future__ import annotations

import importlib
import sys

# subcommand name -> module (imported only when chosen) whose main(argv) runs it
COMMANDS = {
    "decode": "bench.decode",
    "edit": "bench.edit",
    "plots": "bench.plots",
    "rollback": "bench.rollback",
    "speculative": "bench.speculative",
    "verify": "bench.verify",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        names = ", ".join(sorted(COMMANDS))
        print(f"usage: python -m bench {{{names}}} [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
