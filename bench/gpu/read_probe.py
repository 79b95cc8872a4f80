"""Debug probe: what the host pays to read an array the device just computed, and what an
array the host just wrote costs the device, by size. A queued sampled step has the host
read its token (4 bytes) and its pack (515 floats, 2 KB), where a greedy step reads the
token alone, and the loop's split (bench/gpu/loop_probe.py) put the host's draw at ~196 µs
of which the pack's decision is ~23: so is it the pack's read? MLX keeps every buffer in
managed memory, and arrays of 8 bytes or fewer come from a small pool of their own.

Per size, over `--repeats` arrays each computed on the device and evaluated first:
- `read_us`: the host's copy of it (as `np.array`), median; `item_us` for one element;
- `write_us`: a host array of that size made an MLX array and added to on the device,
  evaluated, minus the same addition on a device-made array of that size.

Prints one JSON object.     python -m bench.gpu.read_probe [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import mlx.core as mx
import numpy as np

SIZES = (1, 2, 4, 64, 515, 2048, 8 * 515, 65536)  # floats; 515: a pack, 8 x 515: eight


def _made(n: int, i: int) -> mx.array:
    """n floats computed on the device (a fresh buffer each call), evaluated."""
    a = mx.arange(n, dtype=mx.float32) * float(i + 1)
    mx.eval(a)
    return a


def _median_us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 2)


def _timed(run: Any) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def probe(repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {"device": str(mx.default_device()), "repeats": repeats, "sizes": {}}
    for n in SIZES:
        reads, items, writes, device_made = [], [], [], []
        for i in range(repeats):
            a = _made(n, i)
            reads.append(_timed(lambda a=a: np.array(a, copy=True)))
            b = _made(n, i)
            items.append(_timed(lambda b=b: b[0].item()))
            host = np.full(n, float(i), dtype=np.float32)
            writes.append(_timed(lambda host=host: mx.eval(mx.array(host) + 1.0)))
            c = _made(n, i)
            device_made.append(_timed(lambda c=c: mx.eval(c + 1.0)))
        out["sizes"][str(n)] = {
            "bytes": 4 * n,
            "read_us": _median_us(reads),
            "item_us": _median_us(items),
            "write_us": round(_median_us(writes) - _median_us(device_made), 2),
            "device_add_us": _median_us(device_made),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    print(json.dumps(probe(args.repeats), indent=1))


if __name__ == "__main__":
    main()
