#!/usr/bin/env bash
# On the lent GPU (after tools/gpu/unpack.sh's last parcel, the default model joined): the
# next round after session 24's H100 figures. Sampled decoding (the app's default) queued
# and not, where a sampled step's host time goes (the loop's steps under cProfile, greedy
# beside sampled), and Auto and the block drafter against queued plain decoding, now that
# a step is queued where lookup may draft and a queued step hands the block drafter its
# rows. Each part has its own limit, so a cut run still returns the earlier parts' files.
#     bash tools/gpu/sampled_round.sh
# (AUTO_WORKLOADS, AUTO_MODES, AUTO_RUNS: the speculative part's, e.g. regenerate,code)
set -u
cd "$(dirname "$0")/../.."
source tools/gpu/round_env.sh  # $out, $gguf, the kernel builds compiled
spec() { timeout "$1" python3 -m bench speculative --json "${@:2}"; }
for q in 1 0; do
  BRANCHCHAT_QUEUE_STEPS=$q spec 90 --runs 2 --modes plain --workloads chat \
    --temperature 0.7 --top-p 0.95 --seed 0 > "$out/sampled-queue$q.json" 2> /dev/null
done
for t in 0 0.7; do
  timeout 60 python3 -m bench.gpu.host_probe --model "$gguf" --loop --temperature $t \
    --top-p 0.95 --steps 200 --top 30 > "$out/host-loop-t$t.json" 2>&1
done
# greedy speculation against queued plain steps ($AUTO_WORKLOADS empty: none)
workloads=${AUTO_WORKLOADS-chat,open_chat,regenerate}
[ -n "$workloads" ] && spec 200 --runs "${AUTO_RUNS:-2}" --modes "${AUTO_MODES:-plain,auto,block}" \
  --workloads "$workloads" > "$out/auto-queued.json" 2> /dev/null
python3 - "$out" <<'PY'
import json, sys
folder = sys.argv[1]
for name in ("sampled-queue1", "sampled-queue0", "auto-queued"):
    try:
        r = json.load(open(f"{folder}/{name}.json"))
        print(name, {w: {m: (v[m].get("speedup") or v[m].get("median")) for m in v
                         if isinstance(v[m], dict)} for w, v in r["workloads"].items()})
    except (OSError, ValueError, KeyError) as e:
        print(name, "no figures:", e)
for t in ("0", "0.7"):
    try:
        r = json.load(open(f"{folder}/host-loop-t{t}.json"))
        print("host loop t", t, r["step_us"], [(x["function"], x["own_us"]) for x in r["by_own_time"][:8]])
    except (OSError, ValueError, KeyError) as e:
        print("host loop t", t, "no figures:", e)
PY
