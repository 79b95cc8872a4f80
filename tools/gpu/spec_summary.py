"""One line a workload of a `python -m bench speculative --json` result: plain decoding's
tok/s, whether every mode's tokens were plain decoding's, and each mode's speedup,
accepted / drafted tokens and tokens a verify (the GPU rounds' scripts print it after each
run). Usage: python3 tools/gpu/spec_summary.py RESULT.json"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(path: str) -> int:
    try:
        result = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        print(f"{path}: no figures ({exc})")
        return 1
    for name, work in result["workloads"].items():
        modes = {m: v for m, v in work.items() if isinstance(v, dict) and "speedup" in v}
        line = f"{name:<12} plain {work['plain_tok_s']['median']:8.1f} tok/s  "
        line += f"identical {work.get('identical')}  "
        line += "  ".join(
            f"{m} {v['speedup']:.3f}x acc {v['accepted']}/{v['drafted']}"
            f" a.len {v.get('acceptance_length', 0):.2f}"
            for m, v in modes.items()
        )
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
