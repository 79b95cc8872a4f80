#!/usr/bin/env bash
# On the lent H200 (after tools/gpu/unpack.sh's last parcel and the model joined): where a
# block-drafter request's time goes. The chat workload with the block pool, twice in one
# process (a one-off cost shows as a slow first run), under cProfile, on the plain MLX path
# without the fused step (BRANCHCHAT_FUSED=0), and the drafter's pass op by op against its
# traced pass (BRANCHCHAT_DRAFTER_COMPILE).   bash tools/drafter/device_profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT must name the folder whose files come back}
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1
bench() { timeout 150 python3 -m bench speculative --json --workloads chat "$@"; }
bench --runs 2 --modes plain,block > "$out/profile-chat-runs2.json"
timeout 150 python3 -m cProfile -o /tmp/block.prof -m bench speculative --json --runs 1 \
  --modes block --workloads chat > /dev/null
python3 -c "
import pstats
p = pstats.Stats('/tmp/block.prof')
p.sort_stats('tottime').print_stats(25)
p.sort_stats('cumtime').print_stats(45)" > "$out/profile-block-chat.txt"
head -c 9000 "$out/profile-block-chat.txt" | cut -c1-150
BRANCHCHAT_FUSED=0 bench --runs 1 --modes plain,block > "$out/profile-chat-unfused.json"
# the drafter's pass op by op against its traced pass (the default)
BRANCHCHAT_DRAFTER_COMPILE=0 bench --runs 1 --modes plain,block,auto --workloads chat,mixed \
  > "$out/profile-op-by-op.json"
bench --runs 1 --modes plain,block,auto --workloads chat,mixed > "$out/profile-traced.json"
python3 - "$out" <<'PY'
import json, sys
for name in ("op-by-op", "traced"):
    r = json.load(open(f"{sys.argv[1]}/profile-{name}.json"))
    print(name, r["block_pass_ms"], {w: {m: v[m]["speedup"] for m in ("block", "auto")}
                                     for w, v in r["workloads"].items()})
PY
