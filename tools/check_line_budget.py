"""Fails when a Python file in the repository is over the line budget.

A file past ~400 lines usually holds more than one idea; the budget makes the split happen
when a file grows, not in a later clean-up. Virtual environments, build outputs and
caches are not the project's files and are skipped.

    python tools/check_line_budget.py [--budget N] [root]     (defaults: 400, the repository)

Prints each offender with its line count, longest first, and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

BUDGET = 400
ROOT = Path(__file__).resolve().parent.parent
# What .gitignore keeps out of the repository: environments, build outputs, caches
SKIPPED_DIRS = {
    ".git",
    ".venv",
    "venv",
    "build",
    "dist",
    "results",
    ".device",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
}


def python_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.iterdir()):
        if path.is_dir():
            if path.name not in SKIPPED_DIRS and not path.name.endswith(".egg-info"):
                yield from python_files(path)
        elif path.suffix == ".py":
            yield path


def over_budget(root: Path, budget: int) -> list[tuple[Path, int]]:
    """(file, lines) for each Python file under `root` longer than `budget`, longest first."""
    counts = [(p, len(p.read_text(encoding="utf-8").splitlines())) for p in python_files(root)]
    return sorted(((p, n) for p, n in counts if n > budget), key=lambda pn: (-pn[1], pn[0]))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=BUDGET)
    parser.add_argument("root", nargs="?", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    offenders = over_budget(args.root, args.budget)
    for path, lines in offenders:
        print(f"{path.relative_to(args.root)}: {lines} lines (budget {args.budget})")
    if offenders:
        print(f"{len(offenders)} Python file(s) over {args.budget} lines")
        return 1
    print(f"every Python file is within {args.budget} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
