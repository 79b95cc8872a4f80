#!/usr/bin/env bash
# On the lent H200 (after tools/gpu/unpack.sh's last parcel, the default model joined):
# greedy steps queued ahead of the host (engine/runner/ahead.py), first run on a GPU.
# Their tests on every layer kind and path (the one-launch step's included), then the
# default model's decode through the engine's loop (queued) beside one forward a step,
# on the one-launch step and on the plain MLX path, and where a verify's time goes beside
# a step's (the stamped build at 1..16 rows), and Auto beside plain decoding. $OUT gets the logs.
#     bash tools/gpu/ahead_round.sh
set -u
cd "$(dirname "$0")/../.."
out=${OUT:?OUT must name the folder whose files come back}
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1
timeout -s INT "${TEST_BUDGET:-150}" python3 -m pytest -q -p no:cacheprovider -rfE \
  tests/engine/test_launch_ahead.py tests/bench/test_decode_bench.py > "$out/ahead-tests.txt" 2>&1
grep -E "^(FAILED|ERROR)" "$out/ahead-tests.txt" | cut -c1-300
tail -3 "$out/ahead-tests.txt"
decode() { timeout 150 python3 -m bench decode --runs 3 --steps 64 --contexts 128,512,2048 \
  --paste-tokens 0 --json "$@"; }
decode > "$out/ahead-decode-step.json" 2> "$out/ahead-decode-step.err"
BRANCHCHAT_FUSED=0 decode > "$out/ahead-decode-plain.json" 2> "$out/ahead-decode-plain.err"
python3 - "$out" <<'PY'
import json, sys
for name in ("step", "plain"):
    try:
        ours = json.load(open(f"{sys.argv[1]}/ahead-decode-{name}.json"))["ours"]
    except (OSError, ValueError, KeyError) as e:
        print(name, "no figures:", e)
        continue
    print(name, {k: round(v, 1) for k, v in ours.items() if k.startswith("decode")})
PY
timeout 120 python3 -m bench.gpu.step_probe --contexts 512 --prefetch 1 --rows 1 2 4 8 16 \
  > "$out/ahead-verify-phases.json" 2>&1
cut -c1-600 "$out/ahead-verify-phases.json"
# sampled plain decoding (the app's default), queued on the device's draws and not
for q in 1 0; do
  BRANCHCHAT_QUEUE_STEPS=$q timeout 120 python3 -m bench speculative --json --runs 2 \
    --modes plain --workloads chat,open_chat --temperature 0.7 --top-p 0.95 --seed 0 \
    > "$out/ahead-sampled-queue$q.json" 2> "$out/ahead-sampled-queue$q.err"
done
python3 - "$out" <<'PY'
import json, sys
for q in (1, 0):
    try:
        r = json.load(open(f"{sys.argv[1]}/ahead-sampled-queue{q}.json"))
        print("queue", q, {w: v["plain_tok_s"]["median"] for w, v in r["workloads"].items()})
    except (OSError, ValueError, KeyError) as e:
        print("queue", q, "no figures:", e)
PY
# Auto (lookup) beside plain decoding, which now queues its steps: what Auto's unqueued
# lookup rounds cost on a fresh question, and what drafting still gains after an edit
timeout 150 python3 -m bench speculative --json --runs 1 --modes plain,auto \
  --workloads chat,regenerate > "$out/ahead-speculative.json" 2> "$out/ahead-speculative.err"
python3 - "$out" <<'PY'
import json, sys
try:
    r = json.load(open(f"{sys.argv[1]}/ahead-speculative.json"))
    print({w: {m: v[m].get("speedup") for m in v if isinstance(v[m], dict)}
           for w, v in r["workloads"].items()})
except (OSError, ValueError, KeyError) as e:
    print("no speculative figures:", e)
PY
# a verify of 8 rows in one pass over the weights (28 bytes of spill at 255 registers,
# nvcc 13.0 here) against the engine's 4 rows a pass: is the verify curve the passes?
timeout 120 python3 -m bench.gpu.step_tuning --contexts 512 --repeats 50 \
  --configs 8:0:4:1:16384,8:0:8:1:32768,16:0:8:1:32768 > "$out/ahead-verify-rows.json" 2>&1
tail -c 1500 "$out/ahead-verify-rows.json"
