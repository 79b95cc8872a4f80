"""Totals of a suite run as one pytest per file (tools/gpu/device_all.sh): each log's last
line holds its counts; a log without one (a file cut short before pytest's summary) is
listed as unfinished (a file split in shards has one log a shard), a file of the list
without a log as not started. Usage: python3 tools/gpu/suite_summary.py LOG_DIR FILE_LIST"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def main(folder: Path, listed: list[str]) -> None:
    totals: Counter[str] = Counter()
    unfinished, problems = [], []
    for log in sorted(folder.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        last = next((line for line in reversed(lines) if COUNT.search(line)), None)
        if last is None or " in " not in last:
            unfinished.append(log.stem)
        for n, kind in COUNT.findall(last or ""):
            totals["error" if kind.startswith("error") else kind] += int(n)
        problems += [line[:200] for line in lines if line.startswith(("FAILED", "ERROR"))]
    print(
        f"{len(listed)} files, {len(list(folder.glob('*.log')))} logs: "
        + ", ".join(f"{n} {k}" for k, n in sorted(totals.items()))
    )
    for name in unfinished:
        print(f"UNFINISHED {name}")
    for name in listed:
        stem = name.replace("/", "_")  # a file split in shards has logs FILE@k.log
        logs = [p.name for p in folder.iterdir()]  # no glob: test ids hold brackets
        if f"{stem}.log" not in logs and not any(n.startswith(f"{stem}@") for n in logs):
            print(f"NOT STARTED {name}")
    for line in problems:
        print(line)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]).read_text().split())
