"""`--busy F`: another process takes a fraction F of one core while a bench measures, in
bursts (F of every 5 ms), as a desktop's window or a browser does beside a local model.
A thread pool meets it on a shared machine: a worker preempted in the middle of its chunk
keeps the others waiting (kernels/csrc/pool.c)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

PERIOD_S = 0.005
_BURNER = """
import time
period, busy = {period}, {busy}
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < busy:
        pass
    if period > busy:
        time.sleep(period - busy)
"""


def fraction(text: str) -> float:
    """'0.25' -> 0.25: a fraction of a core, 0 (none) to 1 (a whole core)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--busy takes a fraction like 0.25: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"--busy takes a fraction from 0 to 1: {text!r}")
    return value


@contextmanager
def busy_core(share: float) -> Iterator[subprocess.Popen[bytes] | None]:
    """A process that burns `share` of a core until the block ends (0: none)."""
    if not share:
        yield None
        return
    code = _BURNER.format(period=PERIOD_S, busy=PERIOD_S * share)
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
