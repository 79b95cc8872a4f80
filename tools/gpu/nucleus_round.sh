#!/usr/bin/env bash
# On the lent GPU (after tools/gpu/unpack.sh's last parcel): the nucleus pack and draw as
# one kernel (kernels/nucleus_pack_cuda.py). Its tests and the sampled path's, then
# sampled decoding (the app's default: temperature 0.7, top-p 0.95) with the kernel and
# with MLX's operations (engine/device_sampling.PACK_KERNEL off), plain and Auto, in one
# run each on the same machine.      bash tools/gpu/nucleus_round.sh
# (RUNS: runs a mode, default 2; WORKLOADS: the bench's; TESTS=0 skips the tests)
set -u
cd "$(dirname "$0")/../.."
source tools/gpu/round_env.sh  # $out, $gguf, the kernel builds compiled
if [ "${TESTS:-1}" != 0 ]; then
  timeout -s INT 200 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    tests/kernels/test_nucleus_pack_cuda.py tests/engine/test_sampling_candidates.py \
    tests/engine/test_launch_ahead.py > "$out/nucleus-tests.txt" 2>&1
  grep -E "^(FAILED|ERROR|E  )" "$out/nucleus-tests.txt" | cut -c1-300 | head -30
  tail -1 "$out/nucleus-tests.txt"
fi
workloads=${WORKLOADS:-chat,open_chat,mixed,regenerate,code}
for kernel in 1 0; do
  timeout 200 python3 - "$kernel" "$workloads" "${RUNS:-2}" > "$out/sampled-kernel$kernel.json" \
    2> "$out/sampled-kernel$kernel.err" <<'PY'
import sys
from engine import device_sampling
device_sampling.PACK_KERNEL = sys.argv[1] == "1"
from bench.speculative import main
main(["--json", "--runs", sys.argv[3], "--modes", "plain,auto", "--workloads", sys.argv[2],
      "--temperature", "0.7", "--top-p", "0.95", "--seed", "0"])
PY
done
python3 - "$out" <<'PY'
import json, sys
for kernel in ("1", "0"):
    try:
        r = json.load(open(f"{sys.argv[1]}/sampled-kernel{kernel}.json"))
    except (OSError, ValueError) as e:
        print(f"kernel={kernel}: no figures ({e})")
        continue
    print(f"kernel={kernel}")
    for w, x in r["workloads"].items():
        print(" ", w, "plain", x["plain_tok_s"]["median"], "auto", x["auto"]["tok_s"]["median"],
              x["auto"]["speedup"], "drafted", x["auto"]["drafted"], "kept", x["auto"]["accepted"])
PY
