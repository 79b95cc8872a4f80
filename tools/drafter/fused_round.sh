#!/usr/bin/env bash
# On the lent GPU (after tools/gpu/unpack.sh's last parcel and the model joined): the next
# round after session 28's H100, which drafted nothing (fixed after it: lookup asked every
# round, its match-length confidence cutting the draft). The drafter's one-launch pass on a
# context from past position 0 (two of its tests failed there, unnamed), the queued path's
# and lookup's confidence's tests, then greedy speculation with the block drafter out of
# Auto (the default) and in it (BRANCHCHAT_AUTO_BLOCK). Each part has its own limit, so a
# cut run still returns the earlier parts' files.      bash tools/drafter/fused_round.sh
# (RUNS: runs a mode, default 2; WORKLOADS: the speculative part's; AUTO_BLOCKS: the
# BRANCHCHAT_AUTO_BLOCK values to run, default "0 1"; TESTS=0 skips the tests, so a second
# call can take the second value within one call's limit)
set -u
cd "$(dirname "$0")/../.."
source tools/gpu/round_env.sh  # $out, $gguf, the kernel builds compiled
# the fused pass's file alone first: session 28's H100 failed two of its tests and the
# run's limit cut pytest before it named them
run_tests() {  # NAME FILE...
  local name=$1
  shift
  timeout -s INT 200 python3 -m pytest -q -p no:cacheprovider -rfE "$@" > "$out/$name.txt" 2>&1
  grep -E "^(FAILED|ERROR)" "$out/$name.txt" | cut -c1-300
  tail -1 "$out/$name.txt"
}
if [ "${TESTS:-1}" != 0 ]; then
  run_tests fused-pass-tests tests/engine/test_block_pass_fused.py
  run_tests fused-round-tests tests/engine/test_launch_ahead_pool.py \
    tests/engine/test_drafter_pool.py tests/engine/test_match_acceptance.py \
    tests/engine/test_launch_ahead.py
fi
workloads=${WORKLOADS:-chat,open_chat,mixed,regenerate,code}
for a in ${AUTO_BLOCKS:-0 1}; do
  BRANCHCHAT_AUTO_BLOCK=$a timeout 240 python3 -m bench speculative --json --runs "${RUNS:-2}" \
    --modes plain,auto,block --workloads "$workloads" > "$out/speculative-auto-block$a.json" \
    2> /dev/null
done
python3 - "$out" ${AUTO_BLOCKS:-0 1} <<'PY'
import json, sys
for a in sys.argv[2:]:
    try:
        r = json.load(open(f"{sys.argv[1]}/speculative-auto-block{a}.json"))
    except (OSError, ValueError) as e:
        print(f"auto_block={a}: no figures ({e})")
        continue
    print(f"auto_block={a}", "pass ms", r.get("block_pass_ms"))
    for w, x in r["workloads"].items():
        print(" ", w, x["plain_tok_s"]["median"], "identical", x["identical"],
              {m: (x[m]["speedup"], x[m]["drafted"]) for m in ("auto", "block") if m in x})
PY
